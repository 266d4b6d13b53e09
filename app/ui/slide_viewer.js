// The slide viewer: a whole slide at every zoom (OpenSeadragon over the server's deep-zoom tiles, app/slides/tiles.py),
// the tissue outline and the tumour probability per cell over it, an opacity slider, hover, and a click that asks
// the page to open a cell. Panning and zooming fetch tiles over HTTP and never rerun the page.
//
// OpenSeadragon is loaded once per page from the server (/vendor/openseadragon/, installed by `make`), as a script
// that defines window.OpenSeadragon.

let loading = null;
// Where each slide was being looked at: a viewer drawn again (a running analysis's new chunks, another overlay)
// opens where the last one was, not on the whole slide.
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

export default function ({ data, parentElement, setTriggerValue }) {
  const root = document.createElement("div");
  root.className = "slide-viewer";
  root.dataset.dzi = data.dzi;
  const bar = document.createElement("div");
  bar.className = "bar";
  const view = document.createElement("div");
  view.className = "view";
  view.style.height = `${data.height}px`;
  const status = document.createElement("span");
  status.className = "status";
  bar.append(status);
  let opacity = null;
  if (data.overlay) {
    const label = document.createElement("label");
    label.textContent = "Overlay opacity ";
    opacity = document.createElement("input");
    opacity.type = "range";
    opacity.min = "0";
    opacity.max = "1";
    opacity.step = "0.05";
    opacity.value = String(data.overlay.opacity);
    opacity.dataset.opacity = "";
    label.append(opacity);
    bar.prepend(label);
    // The colour bar, with its units and range: viridis from low (dark blue) to high (yellow).
    const legend = document.createElement("span");
    legend.className = "legend";
    const ramp = document.createElement("span");
    ramp.className = "ramp";
    legend.append(`${data.overlay.units}: ${data.overlay.low.toFixed(3)} `, ramp, ` ${data.overlay.high.toFixed(3)}`);
    label.after(legend);
  }
  root.append(bar, view);
  parentElement.querySelector(".slide-viewer-host").replaceChildren(root);
  status.textContent = data.caption;

  let viewer = null;
  let alive = true;
  loadOpenSeadragon(document.baseURI).then((OpenSeadragon) => {
    if (!alive) return;
    viewer = OpenSeadragon({
      element: view,
      tileSources: new URL(data.dzi, document.baseURI).href,
      prefixUrl: new URL("vendor/openseadragon/images/", document.baseURI).href,
      showNavigator: true,
      navigatorPosition: "TOP_RIGHT",
      gestureSettingsMouse: { clickToZoom: false },
      crossOriginPolicy: false,
      // A zoom eases over 0.1 s, not OpenSeadragon's default 1.2 s: the view settles as soon as its tiles are in,
      // as a slide viewer's wheel does (python -m benchmarks.browser_latency --page slide measures it).
      animationTime: 0.1,
      drawer: "canvas",
    });
    root.viewer = viewer; // for the browser test
    viewer.addHandler("open", () => {
      const place = places.get(data.dzi);
      if (place) {
        viewer.viewport.zoomTo(place.zoom, null, true);
        viewer.viewport.panTo(new OpenSeadragon.Point(place.x, place.y), true);
      }
      root.dataset.open = "1";
      const width = viewer.world.getItemAt(0).getContentSize().x;
      for (const picture of data.pictures) {
        viewer.addSimpleImage({
          url: picture.url, x: picture.left / width, y: picture.top / width, width: picture.width / width,
          opacity: picture.kind === "overlay" ? Number(opacity ? opacity.value : 1) : 1,
          success: (event) => {
            event.item.kind = picture.kind;
            if (picture.kind === "overlay") root.dataset.overlay = "added";
          },
        });
      }
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
      if (root.dataset.overlay === "added") root.dataset.overlay = "drawn";
    });
    if (data.micronsPerPixel) {
      // A scale bar in micrometres: a round length (1, 2 or 5 times a power of ten) about 120 screen pixels long.
      const scaleBar = document.createElement("div");
      scaleBar.className = "scale-bar";
      view.append(scaleBar);
      const redraw = () => {
        if (!viewer.world.getItemCount()) return;
        const screenPerImage = viewer.viewport.viewportToImageZoom(viewer.viewport.getZoom(true));
        const micronsPerScreen = data.micronsPerPixel / screenPerImage;
        const wanted = 120 * micronsPerScreen;
        const power = 10 ** Math.floor(Math.log10(wanted));
        const length = [5, 2, 1].map((k) => k * power).find((v) => v <= wanted) || power;
        scaleBar.style.width = `${length / micronsPerScreen}px`;
        scaleBar.textContent = length >= 1000 ? `${length / 1000} mm` : `${length} µm`;
        root.dataset.scaleBar = scaleBar.textContent;
      };
      viewer.addHandler("open", redraw);
      viewer.addHandler("animation", redraw);
    }
    if (opacity) {
      opacity.addEventListener("input", () => {
        for (let i = 0; i < viewer.world.getItemCount(); i++) {
          const item = viewer.world.getItemAt(i);
          if (item.kind === "overlay") item.setOpacity(Number(opacity.value));
        }
      });
    }
    const cellAt = (position) => {
      if (!data.cells) return null;
      const point = viewer.viewport.viewerElementToImageCoordinates(position);
      const { top, left, rows, cols, height, width } = data.cells;
      const i = Math.floor((point.y - top) / height);
      const j = Math.floor((point.x - left) / width);
      return i >= 0 && j >= 0 && i < rows && j < cols ? [i, j] : null;
    };
    new OpenSeadragon.MouseTracker({
      element: view,
      moveHandler: (event) => {
        const cell = cellAt(event.position);
        const p = cell ? data.cells.probability[cell[0] * data.cells.cols + cell[1]] : null;
        status.textContent = cell === null ? data.caption
          : p === null ? `cell (${cell[0]}, ${cell[1]}): not evaluated (glass or too little tissue)`
          : `cell (${cell[0]}, ${cell[1]}): P(tumour) = ${p.toFixed(3)}; click to open it in the patch page`;
      },
    });
    viewer.addHandler("canvas-click", (event) => {
      if (!event.quick) return; // a drag pans
      const cell = cellAt(event.position);
      if (cell && data.cells.probability[cell[0] * data.cells.cols + cell[1]] !== null) {
        setTriggerValue("cell", cell);
      }
    });
  }).catch((error) => {
    status.textContent = error.message;
  });
  return () => {
    alive = false;
    if (viewer) {
      if (viewer.world.getItemCount()) {
        const centre = viewer.viewport.getCenter(true);
        places.set(data.dzi, { x: centre.x, y: centre.y, zoom: viewer.viewport.getZoom(true) });
      }
      viewer.destroy();
    }
  };
}
