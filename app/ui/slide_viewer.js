// The slide viewer: a whole slide at every zoom (OpenSeadragon over the server's deep-zoom tiles, app/slides/tiles.py),
// the tissue outline and the tumour probability per cell over it, an opacity slider, hover, and a click that asks
// the page to open a cell. Panning and zooming fetch tiles over HTTP and never rerun the page.
//
// OpenSeadragon is loaded once per page from the server (/vendor/openseadragon/, installed by `make`), as a script
// that defines window.OpenSeadragon. The page hands the viewer the slide's Deep Zoom descriptor (data.descriptor),
// so that the first tiles are asked for as soon as the script runs, and the viewer's buttons are its own, drawn
// without images: OpenSeadragon's 14 button images took the browser's six connections before the first tiles.
//
// The overlays (the tissue outline, P(tumour), the readings of attention) are tiled layers of their own pyramid
// (app/slides/overlay_tiles.py), made by the server from the slide's finished chunks: a refresh of a running analysis
// sends only a version and the rectangles of the chunks finished since, and the viewer fetches again only the tiles
// over them. Hover asks the server for the one cell under the mouse. P(tumour) and the readings of attention come in
// one layer of "values" tiles, each pixel every overlay's colour index and its state (app/slides/overlay_colours.py),
// coloured here for the overlay chosen (colourValues): choosing another colours the tiles held again and fetches
// nothing.
//
// One viewer per slide outlives the page's reruns: new data for the same slide (the outline once the tissue is
// found, an analysis's new chunks, another overlay) changes its layers, bar and grid in place, without opening
// the slide again or reloading a tile of the slide. A viewer no rerun took back within KEEP_MS is destroyed.

const KEEP_MS = 5000;
const VIEW_SETTLE_MS = 300; // the view is told to the page once a pan or zoom has rested this long
const SWAP_MS = 5000; // the longest a replaced layer stays under its successor while the successor's tiles load
let loading = null;
const kept = new Map(); // dzi -> viewer entry, between a rerun's cleanup and the next call
const mounted = new Map(); // dzi -> viewer entry on the page
// Where each slide was being looked at: a slide opened again opens where it was left, not on the whole slide.
// Its views as scanned and stain-normalised (a tile route's "~method" suffix) share one place, so that the Stain
// control switches the view's tiles and not where it looks.
const places = new Map();

function placeKey(dzi) {
  return dzi.replace(/~[a-z]+(?=\.dzi$)/, "");
}

// Kept as the view moves, while the viewer is on the page: once taken off it (a rerun for another view), its
// container's size changes under it and so would its zoom (a switch of the Stain control measured 1.18 times).
function keepPlace(entry) {
  if (!entry.placed || mounted.get(entry.data.dzi) !== entry) return;
  const centre = entry.viewer.viewport.getCenter(true);
  places.set(placeKey(entry.data.dzi), { x: centre.x, y: centre.y, zoom: entry.viewer.viewport.getZoom(true) });
}

// OpenSeadragon asks for every animation frame while a viewer is open (and its navigator for every one again),
// whether or not anything moves: in headless Chromium on two cores an idle slide cost a third of a core, 60 frame
// lifecycles a second. While nothing moves (no viewer animating, no input within BUSY_MS), its
// frames come every IDLE_FRAME_MS instead: a tile that arrives meanwhile is drawn within that, and an input (pointer,
// wheel, key) brings the display's rate back at once, the frames already waiting included.
// An idle tick with nothing to do (no viewer animating, every layer's tiles in and drawn) makes no frame at all: in
// the gigapixel slide's analysis nine ticks in ten found nothing, and each empty frame still cost Chromium its main
// frame and commit (5 ms). One frame every HEARTBEAT_MS still runs, for what OpenSeadragon notices only in a frame
// (its container resized).
const IDLE_FRAME_MS = 100;
const HEARTBEAT_MS = 1000;
const BUSY_MS = 1000;
let busyUntil = 0;
let lastFrame = 0;
// The frames asked for while idle, our id (negative: never a browser's) -> callback: all of them, the viewer's and
// its navigator's, run in one browser frame every IDLE_FRAME_MS (two loops apart would make two frames).
const waiting = new Map();
let nextWaiting = 0;
let tick = null; // the timer that runs them
let frame = null; // the browser's requestAnimationFrame, as OpenSeadragon found it

function busy() {
  return performance.now() < busyUntil
    || [...mounted.values()].some((entry) => entry.viewer && entry.viewer.isAnimating());
}

function hasWork(viewer) {
  if (!viewer) return false;
  if (viewer.isAnimating() || viewer.world.needsDraw()) return true;
  for (let i = 0; i < viewer.world.getItemCount(); i++) {
    if (!viewer.world.getItemAt(i).getFullyLoaded()) return true;
  }
  return false;
}

function idleWork() {
  return [...mounted.values()].some((entry) => hasWork(entry.viewer) || hasWork(entry.viewer?.navigator));
}

function runWaiting() {
  clearTimeout(tick);
  tick = null;
  if (!waiting.size) return;
  const now = performance.now();
  if (!busy() && !idleWork() && now - lastFrame < HEARTBEAT_MS) {
    tick = setTimeout(runWaiting, IDLE_FRAME_MS); // nothing to draw: look again, no frame
    return;
  }
  lastFrame = now;
  const ids = [...waiting.keys()];
  // Run in the browser's next frame; one cancelled before then (a viewer destroyed) stays out.
  frame((time) => ids.forEach((id) => {
    const callback = waiting.get(id);
    waiting.delete(id);
    if (callback) callback(time);
  }));
}

function keepBusy() {
  busyUntil = performance.now() + BUSY_MS;
  if (frame) runWaiting();
}

function throttleFrames(OpenSeadragon) {
  if (OpenSeadragon.framesThrottled) return;
  OpenSeadragon.framesThrottled = true;
  frame = OpenSeadragon.requestAnimationFrame;
  const cancel = OpenSeadragon.cancelAnimationFrame;
  OpenSeadragon.requestAnimationFrame = (callback) => {
    if (busy()) return frame(callback);
    const id = --nextWaiting;
    waiting.set(id, callback);
    tick ??= setTimeout(runWaiting, IDLE_FRAME_MS);
    return id;
  };
  OpenSeadragon.cancelAnimationFrame = (id) => (id >= 0 ? cancel(id) : waiting.delete(id));
}

function loadOpenSeadragon(base) {
  if (window.OpenSeadragon) return Promise.resolve(window.OpenSeadragon);
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = new URL("vendor/openseadragon/openseadragon.min.js", base).href;
      script.onload = () => {
        throttleFrames(window.OpenSeadragon);
        resolve(window.OpenSeadragon);
      };
      script.onerror = () => reject(new Error("OpenSeadragon could not be loaded (run make vendor)"));
      document.head.append(script);
    });
  }
  return loading;
}

// The colours of a values tile (app/slides/overlay_colours.py's palette), fetched once per page.
let palette = null;

export function loadPalette() {
  palette ??= fetch(new URL("slides/overlays/palette.json", document.baseURI).href)
    .then((response) => (response.ok ? response.json() : Promise.reject(new Error(`palette: ${response.status}`))))
    .then((said) => ({ ...said, viridis: Uint8Array.from(said.viridis.flat()) }))
    .catch((error) => {
      palette = null; // asked again for the next tile
      throw error;
    });
  return palette;
}

// RGBA pixels of a values tile (width pixels a row, its first pixel at (x0, y0) of its level), coloured in place for
// the overlay kind: viridis at the kind's index (its channel, reversed for α⁺: the palette says) where evaluated, the stripes of "not yet" where waiting (on the level's
// own pixels, so that they run on across tiles), nothing elsewhere. The server's coloured tile of the kind, exactly
// (tests/test_app_browser_slides.py).
export function colourValues(pixels, width, kind, colours, x0, y0) {
  const { viridis, waiting, gap, stripe, evaluated, waitingMark, channels } = colours;
  const channel = channels[kind];
  const reverse = colours.reversed.includes(kind);
  for (let at = 0, n = pixels.length; at < n; at += 4) {
    const alpha = pixels[at + 3];
    if (alpha === evaluated) {
      const index = pixels[at + channel];
      const from = 4 * (reverse ? 255 - index : index);
      pixels[at] = viridis[from];
      pixels[at + 1] = viridis[from + 1];
      pixels[at + 2] = viridis[from + 2];
      pixels[at + 3] = viridis[from + 3];
    } else if (alpha === waitingMark) {
      const pixel = at / 4;
      const row = y0 + Math.floor(pixel / width);
      const col = x0 + (pixel % width);
      pixels.set(Math.floor((row + col) / stripe) % 2 === 0 ? waiting : gap, at);
    } else {
      pixels.fill(0, at, at + 4);
    }
  }
  return pixels;
}

// OpenSeadragon's data pipeline hands each values tile here as it comes in and again on requestInvalidate (from its
// data as fetched): coloured for the kind the viewer shows now.
async function colourTile(entry, event) {
  if (!event.tile.getUrl().includes("/values/")) return; // the slide's own tiles and the outline as they came
  const [colours, context] = await Promise.all([loadPalette().catch(() => null), event.getData("context2d")]);
  if (event.outdated()) return;
  const { width, height } = context.canvas;
  if (colours) {
    const image = context.getImageData(0, 0, width, height);
    const size = event.tiledImage.source.getTileWidth(event.tile.level);
    colourValues(image.data, width, entry.colouring, colours, event.tile.x * size, event.tile.y * size);
    context.putImageData(image, 0, 0);
  } else {
    context.clearRect(0, 0, width, height); // no colours to be had: nothing drawn, never the indices as colours
  }
  await event.setData(context, "context2d");
}

// Another overlay chosen: the values tiles held (the shown layer's and any it replaces) coloured again, nothing
// fetched.
function recolour(entry, kind) {
  entry.colouring = kind;
  const record = entry.layers.overlay;
  const items = record ? [record.item, ...record.replaces].filter(Boolean) : [];
  const { root } = entry;
  root.dataset.overlay = "loading";
  keepBusy();
  Promise.all(items.map((item) => item.requestInvalidate(true))).then(() => {
    if (entry.colouring !== kind) return;
    root.dataset.overlayKind = kind;
    root.dataset.overlay = "added"; // "drawn" with the next frame, which this asks for
    entry.viewer?.forceRedraw();
    keepBusy();
  });
}

function element(tag, className) {
  const made = document.createElement(tag);
  if (className) made.className = className;
  return made;
}

// The bar above the view, of a fixed height (nothing in it, nor hovering, moves the view): the opacity slider and
// the colour bar (with its units and range: viridis from low, dark blue, to high, yellow) where there is an overlay,
// and the status line. Built again only when the overlay's legend changes: a refresh of a running analysis changes
// the status line's text alone, and the slider under the user's mouse stays the one being dragged.
function drawBar(entry) {
  const { data } = entry;
  const overlay = data.layers?.overlay;
  const legend = overlay ? `${overlay.units}|${overlay.low}|${overlay.high}` : "";
  if (entry.status && entry.legend === legend) {
    if (entry.status.textContent !== data.caption) {
      entry.status.textContent = data.caption;
      entry.status.title = data.caption;
    }
    return;
  }
  const status = element("span", "status");
  status.textContent = data.caption;
  status.title = data.caption;
  const parts = [];
  if (overlay) {
    const label = element("label");
    label.textContent = "Overlay opacity ";
    const opacity = element("input");
    Object.assign(opacity, { type: "range", min: "0", max: "1", step: "0.05" });
    opacity.value = String(entry.opacity ?? overlay.opacity);
    opacity.dataset.opacity = "";
    opacity.addEventListener("input", () => {
      entry.opacity = Number(opacity.value);
      const record = entry.layers.overlay;
      if (record?.item) record.item.setOpacity(entry.opacity); // the layer's tiles as they are: nothing fetched
    });
    label.append(opacity);
    const ramp = element("span", "legend");
    ramp.append(`${overlay.units}: ${overlay.low.toFixed(1)} `, element("span", "ramp"), ` ${overlay.high.toFixed(1)}`);
    parts.push(label, ramp);
  }
  entry.bar.replaceChildren(...parts, status);
  entry.status = status;
  entry.legend = legend;
}

// The version of a layer's tile (level, x, y): the layer's base (a full reload's) and the last version at which a
// chunk finished under it. A tile no chunk has finished under since keeps its URL from one layer to the next, so that
// OpenSeadragon's tile cache (one per viewer, by URL) hands the next layer the tile it has, without asking again.
function tileVersion(layer, record, level, x, y) {
  const side = layer.tileSize * layer.scale * 2 ** (layer.maxLevel - level); // level-0 pixels across a tile
  const x0 = x * side;
  const y0 = y * side;
  let last = 0;
  for (const [cx, cy, w, h, version] of record.changes) {
    if (version > last && cx < x0 + side && cx + w > x0 && cy < y0 + side && cy + h > y0) last = version;
  }
  return `${record.base}.${last}`;
}

// What a layer's tiles are: a layer of the same key brings the one shown up to date (P(tumour) and the readings share
// one, of values tiles).
function layerKey(layer) {
  return `${layer.base}|${layer.tiles ?? layer.kind}`;
}

// A layer's tiles, on its own pyramid, each tile's URL naming its version (tileVersion).
function layerSource(layer, record) {
  const base = new URL(layer.base, document.baseURI).href;
  return {
    width: layer.width, height: layer.height, tileSize: layer.tileSize, tileOverlap: 0,
    minLevel: layer.minLevel, maxLevel: layer.maxLevel,
    getTileUrl: (level, x, y) => `${base}${layer.tiles ?? layer.kind}/${level}/${x}_${y}.png`
      + `?v=${tileVersion(layer, record, level, x, y)}`,
  };
}

// The layers over the slide (outline, overlay): a new one added over the old, which is removed once the new one's
// tiles in view are in, so that switching never shows the slide bare; an overlay brought up to date in place.
// At most one layer of a kind loads at a time: chunks that finish while one loads are held (their rectangles
// gathered) and brought in by one layer once it is in. A layer added per refresh never finished loading on the
// gigapixel slide's whole view, where each coarse tile covers many chunks, and each one kept the canvas redrawing.
function drawLayers(entry) {
  const { viewer, data, root } = entry;
  if (!viewer || !viewer.world.getItemCount()) return;
  const layers = data.layers || {};
  for (const kind of ["overlay", "outline"]) {
    const layer = layers[kind];
    const record = entry.layers[kind];
    const held = entry.held[kind];
    if (!layer) {
      if (record) for (const item of [record.item, ...record.replaces]) if (item) viewer.world.removeItem(item);
      delete entry.layers[kind];
      delete entry.held[kind];
      delete root.dataset[kind];
      continue;
    }
    const key = layerKey(layer);
    const version = layer.version ?? 0;
    const recoloured = kind === "overlay" && entry.colouring !== layer.kind; // the same tiles, another's colours
    if (record && record.key === key && recoloured) recolour(entry, layer.kind);
    if (record && record.key === key) {
      const at = held ? held.version : record.version; // the version the viewer holds, or will once it is in
      if (version === at) continue;
      // Chunks finished since: a new layer over the shown one whose tiles under them have new URLs and whose others
      // are the shown layer's (from the tile cache); the shown layer is removed once the new one is drawn.
      if (layer.rects && layer.since === at) {
        const rects = [...(held ? held.rects : []), ...layer.rects];
        if (record.loading) {
          entry.held[kind] = { version, rects };
        } else if (!rects.some((rect) => inView(entry, rect))) {
          delete entry.held[kind];
          keepOutOfView(entry, kind, record, version, rects);
        } else {
          delete entry.held[kind];
          addLayer(entry, kind, layer, key, version, record, rects);
        }
        continue;
      }
    }
    delete entry.held[kind];
    addLayer(entry, kind, layer, key, version, record, null);
  }
}

// Whether a level-0 rectangle [x, y, width, height] meets the view.
function inView(entry, [x, y, width, height]) {
  const { viewer } = entry;
  const view = viewer.world.getItemAt(0).viewportToImageRectangle(viewer.viewport.getBounds(true));
  return x < view.x + view.width && x + width > view.x && y < view.y + view.height && y + height > view.y;
}

// Chunks finished out of view change nothing that is drawn: the shown layer takes them without a new one (once the
// view was done, every refresh loaded and drew the view's tiles again for nothing). Tiles made from now on name the
// new version; tiles the layer made before, over those chunks, are stale, so a view that comes to meet them brings
// in a new layer (refreshOutside).
function keepOutOfView(entry, kind, record, version, rects) {
  record.changes.push(...rects.map((rect) => [...rect, version]));
  record.version = version;
  record.outside = [...(record.outside || []), ...rects];
  if (kind === "overlay") {
    entry.values.clear();
    entry.root.dataset.overlayVersion = String(version);
  }
}

function refreshOutside(entry) {
  for (const kind of ["overlay", "outline"]) {
    const record = entry.layers[kind];
    const layer = entry.data.layers?.[kind];
    if (!record || record.loading || !record.outside?.length || !layer) continue;
    if (layerKey(layer) !== record.key || !record.outside.some((rect) => inView(entry, rect))) continue;
    addLayer(entry, kind, layer, record.key, record.version, record, []);
  }
}

function addLayer(entry, kind, layer, key, version, previous, rects) {
  const { viewer, root } = entry;
  const record = rects
    ? { key, version, base: previous.base, changes: [...previous.changes, ...rects.map((r) => [...r, version])] }
    : { key, version, base: version, changes: [] };
  Object.assign(record, { item: null, replaces: [], loading: true });
  if (kind === "overlay") {
    entry.values.clear();
    entry.colouring = layer.kind;
  }
  if (rects) {
    entry.root.dataset.overlayVersion = String(version);
    entry.root.dataset.tilesRefreshed = String(Number(entry.root.dataset.tilesRefreshed || 0) + rects.length);
  }
  if (previous) record.replaces = [previous.item, ...previous.replaces].filter(Boolean);
  entry.layers[kind] = record;
  root.dataset[kind] = "loading"; // until the new layer is in: a benchmark or test waits for "drawn" after it
  const width = viewer.world.getItemAt(0).getContentSize().x;
  // The layer is in (its tiles in view loaded, or SWAP_MS gone by): the one it replaces goes, and what was held
  // for it comes in.
  const loaded = () => {
    if (!record.loading || entry.layers[kind] !== record) return;
    record.loading = false;
    for (const item of record.replaces) viewer.world.removeItem(item);
    record.replaces = [];
    const held = entry.held[kind];
    const current = entry.data.layers?.[kind];
    if (held && current && layerKey(current) === key) {
      delete entry.held[kind];
      addLayer(entry, kind, current, key, held.version, record, held.rects);
    }
  };
  viewer.addTiledImage({
    tileSource: layerSource(layer, record),
    x: 0, y: 0, width: (layer.width * layer.scale) / width,
    // The overlay just above the slide, the outline above everything.
    ...(kind === "overlay" ? { index: 1 } : {}),
    opacity: kind === "overlay" ? (entry.opacity ?? layer.opacity) : 1,
    success: (event) => {
      if (entry.layers[kind] !== record) {
        viewer.world.removeItem(event.item); // overtaken by a newer layer while it opened
        return;
      }
      record.item = event.item;
      root.dataset[kind] = "added"; // data-outline, data-overlay: "drawn" once a frame shows it
      root.dataset[`${kind}Kind`] = layer.kind;
      root.dataset[`${kind}Version`] = String(record.version);
      if (event.item.getFullyLoaded()) {
        loaded();
        return;
      }
      const change = (state) => {
        if (!state.fullyLoaded) return;
        event.item.removeHandler("fully-loaded-change", change);
        loaded();
      };
      event.item.addHandler("fully-loaded-change", change);
      setTimeout(loaded, SWAP_MS);
    },
    error: () => {
      record.loading = false; // a layer that cannot open holds nothing back
    },
  });
}

function drawScaleBar(entry) {
  const { viewer, data, scaleBar, root } = entry;
  scaleBar.hidden = !data.micronsPerPixel;
  if (!data.micronsPerPixel || !viewer || !viewer.world.getItemCount()) return;
  // A round length (1, 2 or 5 times a power of ten) about 120 screen pixels long.
  const screenPerImage = viewer.viewport.viewportToImageZoom(viewer.viewport.getZoom(true));
  const micronsPerScreen = data.micronsPerPixel / screenPerImage;
  const wanted = 120 * micronsPerScreen;
  const power = 10 ** Math.floor(Math.log10(wanted));
  const length = [5, 2, 1].map((k) => k * power).find((v) => v <= wanted) || power;
  scaleBar.style.width = `${length / micronsPerScreen}px`;
  scaleBar.textContent = length >= 1000 ? `${length / 1000} mm` : `${length} µm`;
  root.dataset.scaleBar = scaleBar.textContent;
}

// The cell under a point of the view (viewer-element pixels): the one function hover and click both use.
function cellAt(entry, position) {
  const { viewer, data } = entry;
  if (!data.cells) return null;
  const point = viewer.world.getItemAt(0).viewerElementToImageCoordinates(position);
  const { top, left, rows, cols, height, width } = data.cells;
  const i = Math.floor((point.y - top) / height);
  const j = Math.floor((point.x - left) / width);
  return i >= 0 && j >= 0 && i < rows && j < cols ? [i, j] : null;
}

// What the server says of a cell (its state and P(tumour)), asked once per cell and overlay version, one at a time:
// the latest cell hovered is asked next.
function lookUp(entry, cell) {
  const name = `${cell[0]}_${cell[1]}`;
  if (entry.values.has(name)) return entry.values.get(name);
  const base = entry.data.layers?.overlay?.base;
  if (!base || entry.asking) return undefined;
  entry.asking = name;
  fetch(new URL(`${base}cells/${name}.json`, document.baseURI).href)
    .then((response) => (response.ok ? response.json() : null))
    .catch(() => null)
    .then((value) => {
      entry.asking = null;
      if (value) entry.values.set(name, value);
      showHover(entry);
    });
  return undefined;
}

function showHover(entry) {
  const { readout, hovered, root } = entry;
  if (!hovered) {
    readout.hidden = true;
    delete root.dataset.hover;
    return;
  }
  const [i, j] = hovered;
  const value = lookUp(entry, hovered);
  readout.textContent = value === undefined ? `cell (${i}, ${j}) ...`
    : value.state === "evaluated"
      ? `cell (${i}, ${j}): P(tumour) = ${value.tumour.toFixed(3)}; click to open it in the patch page`
      : value.state === "waiting" ? `cell (${i}, ${j}): not yet analysed`
        : `cell (${i}, ${j}): not evaluated (glass or too little tissue)`;
  readout.hidden = false;
  root.dataset.hover = readout.textContent;
}

// The level-0 rectangle in view, told to the page once the view rests (the analysis takes what is in view first).
function reportView(entry) {
  clearTimeout(entry.viewTimer);
  entry.viewTimer = setTimeout(() => {
    const { viewer } = entry;
    if (!viewer || !viewer.world.getItemCount() || !entry.setStateValue) return;
    const rect = viewer.world.getItemAt(0).viewportToImageRectangle(viewer.viewport.getBounds(true));
    const view = { x: Math.round(rect.x), y: Math.round(rect.y), width: Math.round(rect.width),
      height: Math.round(rect.height) };
    const said = JSON.stringify(view);
    if (said === entry.viewSaid) return;
    entry.viewSaid = said;
    entry.root.dataset.view = said;
    entry.setStateValue("view", view);
  }, VIEW_SETTLE_MS);
}

// The descriptor the page sent, its tiles' URL made absolute; else the slide's .dzi, fetched.
function tileSource(data) {
  if (!data.descriptor) return new URL(data.dzi, document.baseURI).href;
  const image = data.descriptor.Image;
  return { Image: { ...image, Url: new URL(image.Url, document.baseURI).href } };
}

// Zoom in, zoom out, the whole slide and full screen: what OpenSeadragon's own buttons did, drawn as inline SVG (a
// glyph such as U+26F6, full screen, is missing from many machines' fonts and showed as an empty box).
const ICONS = {
  "Zoom in": "M4 10h12M10 4v12",
  "Zoom out": "M4 10h12",
  "The whole slide": "M3 10 10 3l7 7M5 8.5V17h10V8.5",
  "Full screen": "M3 7V3h4M13 3h4v4M17 13v4h-4M7 17H3v-4",
};

function icon(title) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 20 20");
  svg.setAttribute("width", "18");
  svg.setAttribute("height", "18");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  Object.entries({ d: ICONS[title], fill: "none", stroke: "currentColor", "stroke-width": "2",
    "stroke-linecap": "round", "stroke-linejoin": "round" }).forEach(([name, value]) => path.setAttribute(name, value));
  svg.append(path);
  return svg;
}

function drawControls(entry) {
  const controls = element("div", "controls");
  const buttons = [
    ["Zoom in", (viewer) => viewer.viewport.zoomBy(2)],
    ["Zoom out", (viewer) => viewer.viewport.zoomBy(0.5)],
    ["The whole slide", (viewer) => viewer.viewport.goHome()],
    ["Full screen", () => (document.fullscreenElement ? document.exitFullscreen()
      : entry.root.requestFullscreen())],
  ];
  for (const [title, act] of buttons) {
    const button = element("button");
    Object.assign(button, { type: "button", title });
    button.append(icon(title));
    button.setAttribute("aria-label", title);
    button.dataset.control = title;
    button.addEventListener("click", () => {
      if (!entry.viewer) return;
      act(entry.viewer);
      entry.viewer.viewport.applyConstraints();
    });
    controls.append(button);
  }
  return controls;
}

function open(entry, OpenSeadragon) {
  const { root, view, data } = entry;
  const viewer = OpenSeadragon({
    element: view,
    tileSources: tileSource(data),
    showNavigationControl: false,
    // Only the level that fits the view is fetched, not each coarser one first: a coarse tile of a slide with few
    // levels is made from all of its pixels (the CMU slide's 1:16 tile from 6.6 million), and the first view's
    // coarser tiles shared the two cores with the ones it shows.
    immediateRender: true,
    showNavigator: true,
    navigatorPosition: "TOP_RIGHT",
    gestureSettingsMouse: { clickToZoom: false },
    crossOriginPolicy: false,
    // A zoom eases over 0.1 s, not OpenSeadragon's default 1.2 s: the view settles as soon as its tiles are in,
    // as a slide viewer's wheel does (python -m benchmarks.browser_latency --page slide measures it).
    animationTime: 0.1,
    // A 2D canvas: headless Chromium's software WebGL took 150 ms a frame, the canvas 16 ms.
    drawer: "canvas",
    // Every tile a view needs asked for at once (the browser queues what its connections cannot carry yet), not one
    // a frame (OpenSeadragon's default): an overlay switch on the gigapixel slide's whole view needs about 30, which
    // at one a frame took 0.4-0.6 s to ask for on two busy cores before the last was even made.
    maxTilesPerFrame: 32,
  });
  entry.viewer = viewer;
  root.viewer = viewer; // for the browser test and the benchmarks
  keepBusy(); // its first tiles drawn as they come
  // The navigator shows where the view is on the slide alone. OpenSeadragon mirrors every layer added to the viewer in
  // it, where it would fetch the overlay's coarsest tiles (the whole slide's, made again and drawn again as each chunk
  // finishes) for a thumbnail of 200 pixels.
  const { navigator } = viewer;
  navigator?.world.addHandler("add-item", (event) => setTimeout(() => {
    if (event.item._originalForNavigator !== viewer.world.getItemAt(0)) navigator.world.removeItem(event.item);
  }, 0));
  for (const input of ["pointerdown", "pointermove", "wheel", "keydown", "touchstart"]) {
    root.addEventListener(input, keepBusy, { capture: true, passive: true });
  }
  viewer.addHandler("open", () => {
    const place = places.get(placeKey(entry.data.dzi));
    if (place) {
      viewer.viewport.zoomTo(place.zoom, null, true);
      viewer.viewport.panTo(new OpenSeadragon.Point(place.x, place.y), true);
    }
    entry.placed = true;
    root.dataset.open = "1";
    drawLayers(entry);
    drawScaleBar(entry);
    reportView(entry);
  });
  viewer.addHandler("tile-invalidated", (event) => colourTile(entry, event));
  viewer.addHandler("tile-loaded", (event) => {
    if (event.tiledImage === viewer.world.getItemAt(0)) root.dataset.tiles = String(Number(root.dataset.tiles || 0) + 1);
  });
  // Every frame drawn once the slide has tiles is marked: a canvas redraw is no change of the page, and a
  // benchmark or test waiting for the view to settle waits for the last of these.
  let frames = 0;
  viewer.addHandler("update-viewport", () => {
    if (!root.dataset.tiles) return;
    root.dataset.drawn = String(++frames);
    root.drawnAt = performance.now();
    for (const kind of ["outline", "overlay"]) if (root.dataset[kind] === "added") root.dataset[kind] = "drawn";
  });
  viewer.addHandler("animation", () => drawScaleBar(entry));
  viewer.addHandler("viewport-change", () => {
    keepPlace(entry);
    reportView(entry);
    refreshOutside(entry);
  });
  // Hover shows the cell under the mouse over the view, not in the bar: the layout never changes under the mouse.
  new OpenSeadragon.MouseTracker({
    element: view,
    moveHandler: (event) => {
      const cell = cellAt(entry, event.position);
      if (String(cell) === String(entry.hovered)) return;
      entry.hovered = cell;
      showHover(entry);
    },
    leaveHandler: () => {
      entry.hovered = null;
      showHover(entry);
    },
  });
  viewer.addHandler("canvas-click", (event) => {
    if (!event.quick) return; // a drag pans
    const cell = cellAt(entry, event.position);
    if (!cell) return;
    const known = entry.values.get(`${cell[0]}_${cell[1]}`);
    if (known && known.state !== "evaluated") return; // the page would open nothing
    root.dataset.clicked = String(cell);
    entry.setTriggerValue("cell", cell);
  });
}

function destroy(entry) {
  clearTimeout(entry.timer);
  clearTimeout(entry.viewTimer);
  entry.gone = true;
  if (kept.get(entry.data.dzi) === entry) kept.delete(entry.data.dzi);
  if (!entry.viewer) return;
  entry.viewer.destroy();
  entry.viewer = null;
}

function create(data) {
  const root = element("div", "slide-viewer");
  root.dataset.dzi = data.dzi;
  const bar = element("div", "bar");
  const view = element("div", "view");
  const scaleBar = element("div", "scale-bar");
  const readout = element("div", "readout");
  readout.hidden = true;
  root.append(bar, view);
  const entry = { root, bar, view, scaleBar, readout, data, viewer: null, layers: {}, held: {}, opacity: null,
    values: new Map(), hovered: null, asking: null, colouring: null };
  view.append(scaleBar, readout, drawControls(entry));
  loadOpenSeadragon(document.baseURI).then((OpenSeadragon) => {
    if (!entry.gone) open(entry, OpenSeadragon);
  }).catch((error) => {
    entry.status.textContent = error.message;
  });
  return entry;
}

export default function ({ data, parentElement, setTriggerValue, setStateValue }) {
  // The slide's viewer, kept since the last rerun's cleanup or still mounted (a fragment's rerun can mount the new
  // element before it cleans up the old one); else a new one.
  let entry = kept.get(data.dzi) || mounted.get(data.dzi);
  if (entry) {
    clearTimeout(entry.timer);
    kept.delete(data.dzi);
  } else {
    entry = create(data);
  }
  const owner = {};
  entry.owner = owner;
  mounted.set(data.dzi, entry);
  entry.data = data;
  entry.root.dataset.renders = String(Number(entry.root.dataset.renders || 0) + 1); // the page's data, counted
  entry.setTriggerValue = setTriggerValue;
  entry.setStateValue = setStateValue;
  entry.view.style.height = `${data.height}px`;
  drawBar(entry);
  drawLayers(entry);
  drawScaleBar(entry);
  // A refresh mounts the same viewer again: moved in the page only when it is not there already (taking the view
  // out of the page and putting it back made Chromium lay out and repaint it whole, twice a second).
  const host = parentElement.querySelector(".slide-viewer-host");
  if (host.firstChild !== entry.root || host.childNodes.length !== 1) host.replaceChildren(entry.root);
  return () => {
    if (entry.owner !== owner) return; // a newer call has it
    if (entry.viewer) keepPlace(entry);
    mounted.delete(data.dzi);
    // Kept for the next rerun of the same slide; destroyed if none takes it back.
    for (const other of kept.values()) destroy(other);
    kept.set(data.dzi, entry);
    entry.timer = setTimeout(() => destroy(entry), KEEP_MS);
  };
}
