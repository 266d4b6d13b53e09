// The slide viewer: a whole slide at every zoom (OpenSeadragon over the server's deep-zoom tiles, app/slides/tiles.py),
// the tissue outline and the tumour probability per cell over it, an opacity slider, hover, and a click that asks
// the page to open a cell. Panning and zooming fetch tiles over HTTP and never rerun the page.
//
// OpenSeadragon is loaded once per page from the server (/vendor/openseadragon/, installed by `make`), as a script
// that defines window.OpenSeadragon. The page hands the viewer the slide's Deep Zoom descriptor (data.descriptor),
// so that the first tiles are asked for as soon as the script runs, and the viewer's buttons are its own, drawn
// without images: OpenSeadragon's 14 button images took the browser's six connections before the first tiles.
//
// One viewer per slide outlives the page's reruns: new data for the same slide (the outline once the tissue is
// found, an analysis's new chunks, another overlay) changes its pictures, bar and cells in place, without opening
// the slide again or reloading a tile. A viewer no rerun took back within KEEP_MS is destroyed.

const KEEP_MS = 5000;
let loading = null;
const kept = new Map(); // dzi -> viewer entry, between a rerun's cleanup and the next call
const mounted = new Map(); // dzi -> viewer entry on the page
// Where each slide was being looked at: a slide opened again opens where it was left, not on the whole slide.
const places = new Map();

function loadOpenSeadragon(base) {
  if (window.OpenSeadragon) return Promise.resolve(window.OpenSeadragon);
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = new URL("vendor/openseadragon/openseadragon.min.js", base).href;
      script.onload = () => resolve(window.OpenSeadragon);
      script.onerror = () => reject(new Error("OpenSeadragon could not be loaded (run make vendor)"));
      document.head.append(script);
    });
  }
  return loading;
}

function element(tag, className) {
  const made = document.createElement(tag);
  if (className) made.className = className;
  return made;
}

// The bar above the view: the opacity slider and the colour bar (with its units and range: viridis from low, dark
// blue, to high, yellow) where there is an overlay, and the status line.
function drawBar(entry) {
  const { data } = entry;
  const status = element("span", "status");
  status.textContent = data.caption;
  const parts = [];
  if (data.overlay) {
    const label = element("label");
    label.textContent = "Overlay opacity ";
    const opacity = element("input");
    Object.assign(opacity, { type: "range", min: "0", max: "1", step: "0.05" });
    opacity.value = String(entry.opacity ?? data.overlay.opacity);
    opacity.dataset.opacity = "";
    opacity.addEventListener("input", () => {
      entry.opacity = Number(opacity.value);
      for (const item of entry.items.overlay || []) item.setOpacity(entry.opacity);
    });
    label.append(opacity);
    const legend = element("span", "legend");
    legend.append(`${data.overlay.units}: ${data.overlay.low.toFixed(3)} `, element("span", "ramp"),
      ` ${data.overlay.high.toFixed(3)}`);
    parts.push(label, legend);
  }
  entry.bar.replaceChildren(...parts, status);
  entry.status = status;
}

// The pictures over the slide (outline, overlay): the new ones added, then the old ones of each kind removed once
// the new one is in, so that an update never shows the slide bare.
function drawPictures(entry) {
  const { viewer, data, root } = entry;
  if (!viewer || !viewer.world.getItemCount()) return;
  const width = viewer.world.getItemAt(0).getContentSize().x;
  for (const kind of Object.keys(entry.items)) {
    if (!data.pictures.some((picture) => picture.kind === kind)) {
      for (const item of entry.items[kind]) viewer.world.removeItem(item);
      delete entry.items[kind];
      entry.shown.delete(kind);
      delete root.dataset[kind];
    }
  }
  for (const picture of data.pictures) {
    const key = pictureKey(picture);
    if (entry.shown.get(picture.kind) === key) continue; // the same picture: nothing to redraw
    entry.shown.set(picture.kind, key);
    viewer.addSimpleImage({
      url: picture.url, x: picture.left / width, y: picture.top / width, width: picture.width / width,
      opacity: picture.kind === "overlay" ? (entry.opacity ?? data.overlay?.opacity ?? 1) : 1,
      success: (event) => {
        if (entry.shown.get(picture.kind) !== key) {
          viewer.world.removeItem(event.item); // overtaken by a newer picture while it loaded
          return;
        }
        for (const item of entry.items[picture.kind] || []) viewer.world.removeItem(item);
        entry.items[picture.kind] = [event.item];
        root.dataset[picture.kind] = "added"; // data-outline, data-overlay: "drawn" once a frame shows it
      },
    });
  }
}

// What identifies a picture: its kind, place and a hash of its data URL.
function pictureKey(picture) {
  let hash = 0;
  for (let i = 0; i < picture.url.length; i++) hash = (Math.imul(hash, 31) + picture.url.charCodeAt(i)) | 0;
  return `${picture.kind}|${picture.left}|${picture.top}|${picture.width}|${picture.url.length}|${hash}`;
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

function cellAt(entry, position) {
  const { viewer, data } = entry;
  if (!data.cells) return null;
  const point = viewer.viewport.viewerElementToImageCoordinates(position);
  const { top, left, rows, cols, height, width } = data.cells;
  const i = Math.floor((point.y - top) / height);
  const j = Math.floor((point.x - left) / width);
  return i >= 0 && j >= 0 && i < rows && j < cols ? [i, j] : null;
}

// The descriptor the page sent, its tiles' URL made absolute; else the slide's .dzi, fetched.
function tileSource(data) {
  if (!data.descriptor) return new URL(data.dzi, document.baseURI).href;
  const image = data.descriptor.Image;
  return { Image: { ...image, Url: new URL(image.Url, document.baseURI).href } };
}

// Zoom in, zoom out, the whole slide and full screen: what OpenSeadragon's own buttons did, as text buttons.
function drawControls(entry) {
  const controls = element("div", "controls");
  const buttons = [
    ["+", "Zoom in", (viewer) => viewer.viewport.zoomBy(2)],
    ["\u2212", "Zoom out", (viewer) => viewer.viewport.zoomBy(0.5)],
    ["\u2302", "The whole slide", (viewer) => viewer.viewport.goHome()],
    ["\u26f6", "Full screen", () => (document.fullscreenElement ? document.exitFullscreen()
      : entry.root.requestFullscreen())],
  ];
  for (const [text, title, act] of buttons) {
    const button = element("button");
    Object.assign(button, { type: "button", textContent: text, title });
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
  });
  entry.viewer = viewer;
  root.viewer = viewer; // for the browser test and the benchmarks
  viewer.addHandler("open", () => {
    const place = places.get(entry.data.dzi);
    if (place) {
      viewer.viewport.zoomTo(place.zoom, null, true);
      viewer.viewport.panTo(new OpenSeadragon.Point(place.x, place.y), true);
    }
    root.dataset.open = "1";
    drawPictures(entry);
    drawScaleBar(entry);
  });
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
  new OpenSeadragon.MouseTracker({
    element: view,
    moveHandler: (event) => {
      const { data: now, status } = entry;
      const cell = cellAt(entry, event.position);
      const p = cell ? now.cells.probability[cell[0] * now.cells.cols + cell[1]] : null;
      status.textContent = cell === null ? now.caption
        : p === null ? `cell (${cell[0]}, ${cell[1]}): not evaluated (glass or too little tissue)`
        : `cell (${cell[0]}, ${cell[1]}): P(tumour) = ${p.toFixed(3)}; click to open it in the patch page`;
    },
  });
  viewer.addHandler("canvas-click", (event) => {
    if (!event.quick) return; // a drag pans
    const cell = cellAt(entry, event.position);
    const now = entry.data;
    if (cell && now.cells.probability[cell[0] * now.cells.cols + cell[1]] !== null) {
      entry.setTriggerValue("cell", cell);
    }
  });
}

function destroy(entry) {
  clearTimeout(entry.timer);
  entry.gone = true;
  if (kept.get(entry.data.dzi) === entry) kept.delete(entry.data.dzi);
  if (!entry.viewer) return;
  if (entry.viewer.world.getItemCount()) {
    const centre = entry.viewer.viewport.getCenter(true);
    places.set(entry.data.dzi, { x: centre.x, y: centre.y, zoom: entry.viewer.viewport.getZoom(true) });
  }
  entry.viewer.destroy();
  entry.viewer = null;
}

function create(data) {
  const root = element("div", "slide-viewer");
  root.dataset.dzi = data.dzi;
  const bar = element("div", "bar");
  const view = element("div", "view");
  const scaleBar = element("div", "scale-bar");
  root.append(bar, view);
  const entry = { root, bar, view, scaleBar, data, viewer: null, items: {}, shown: new Map(), opacity: null };
  view.append(scaleBar, drawControls(entry));
  loadOpenSeadragon(document.baseURI).then((OpenSeadragon) => {
    if (!entry.gone) open(entry, OpenSeadragon);
  }).catch((error) => {
    entry.status.textContent = error.message;
  });
  return entry;
}

export default function ({ data, parentElement, setTriggerValue }) {
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
  entry.setTriggerValue = setTriggerValue;
  entry.view.style.height = `${data.height}px`;
  drawBar(entry);
  drawPictures(entry);
  drawScaleBar(entry);
  parentElement.querySelector(".slide-viewer-host").replaceChildren(entry.root);
  return () => {
    if (entry.owner !== owner) return; // a newer call has it
    mounted.delete(data.dzi);
    // Kept for the next rerun of the same slide; destroyed if none takes it back.
    for (const other of kept.values()) destroy(other);
    kept.set(data.dzi, entry);
    entry.timer = setTimeout(() => destroy(entry), KEEP_MS);
  };
}
