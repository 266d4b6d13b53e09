// The slide viewer's module (slide_viewer.js), fetched once per page from the server (app/slides/overlay_routes.py,
// its URL naming its version) rather than sent in every message that draws the viewer: Streamlit puts a component's
// inline code in each of them, 20 KB each time the overlay changed.
const url = new URL("slides/viewer.js?v=__VERSION__", document.baseURI).href;
let loading = null;

export default function (args) {
  loading = loading || import(url);
  let cleanup = null;
  let gone = false;
  loading.then((viewer) => {
    if (!gone) cleanup = viewer.default(args);
  }).catch((error) => {
    const host = args.parentElement.querySelector(".slide-viewer-host");
    if (host && !gone) host.textContent = `The slide viewer could not be loaded: ${error.message}`;
  });
  return () => {
    gone = true;
    if (cleanup) cleanup();
  };
}
