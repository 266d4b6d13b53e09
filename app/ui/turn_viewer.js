// The turn viewer: every orientation's map of the image, turned and mirrored in the browser.
//
// The payload (app/pictures/turn_frames.py) holds the image once, the maps as 8-bit positions in the colour
// range, and for every group element g where each panel of g.x comes from. A click on a turn redraws the panels
// from what the page already has: the pixels are moved by g (an exact permutation of the grid, the same as
// models.Group.act_on_plane) and blended as app.pictures.map_style.overlay blends them, in the same double
// precision and order, so a frame equals the server's picture of it to the last byte. No request is made.

// The element each viewer shows, kept while the page lives: a rerun that redraws a viewer (another layer,
// reading or patch) keeps the user's turn.
const shownBy = new Map();
const playedBy = new Map(); // viewer -> the key of the last animation it played
// The animation's frames arrive in chunks, each its own element of this component (``data.feed``) sent as soon as
// the server has computed it: "viewer|key" -> chunks by first frame, and an event for a viewer already mounted.
const chunksOf = new Map();
const arrivals = new EventTarget();

function feed(chunk) {
  const name = `${chunk.viewer}|${chunk.key}`;
  if (!chunksOf.has(name)) chunksOf.set(name, new Map());
  chunksOf.get(name).set(chunk.start, chunk);
  arrivals.dispatchEvent(new CustomEvent(name, { detail: chunk }));
}
const decoded = new Map(); // data URL -> Promise of RGBA bytes
const moves = new Map(); // "size/element" -> Int32Array: output pixel -> source pixel

function pixelsOf(url, width, height = width) {
  if (!decoded.has(url)) {
    decoded.set(url, (async () => {
      const image = new Image();
      image.src = url;
      await image.decode();
      const canvas = document.createElement("canvas");
      canvas.width = width;
      canvas.height = height;
      const context = canvas.getContext("2d", { willReadFrequently: true });
      context.drawImage(image, 0, 0);
      return context.getImageData(0, 0, width, height).data;
    })());
  }
  return decoded.get(url);
}

// Panel h of a picture of H panels side by side, as the RGBA of one panel.
function panelOf(sideBySide, h, count, size) {
  const out = new Uint8ClampedArray(size * size * 4);
  for (let i = 0; i < size; i++) {
    const from = (i * count * size + h * size) * 4;
    out.set(sideBySide.subarray(from, from + size * 4), i * size * 4);
  }
  return out;
}

// Where each output pixel of g.x comes from: torch.rot90(x, k, dims=(-2, -1)), then the rows flipped if g >= 4.
function moveOf(size, element) {
  const key = `${size}/${element}`;
  if (!moves.has(key)) {
    let index = Int32Array.from({ length: size * size }, (_, i) => i);
    for (let k = 0; k < element % 4; k++) {
      const turned = new Int32Array(size * size);
      for (let i = 0; i < size; i++) {
        for (let j = 0; j < size; j++) turned[i * size + j] = index[j * size + (size - 1 - i)];
      }
      index = turned;
    }
    if (element >= 4) {
      const flipped = new Int32Array(size * size);
      for (let i = 0; i < size; i++) {
        for (let j = 0; j < size; j++) flipped[i * size + j] = index[(size - 1 - i) * size + j];
      }
      index = flipped;
    }
    moves.set(key, index);
  }
  return moves.get(key);
}

// numpy's np.round: halves go to the even neighbour.
function roundHalfEven(x) {
  const r = Math.round(x);
  return x - Math.floor(x) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

function blendPanel(out, rgba, q, imageMove, mapMove, data, outline) {
  const { lut, opacity, signed, shadeFloor, style } = data;
  const n = imageMove.length;
  for (let p = 0; p < n; p++) {
    const s = imageMove[p] * 4;
    const v = q[mapMove[p] * 4];
    const o = p * 4;
    if (style === "side") {
      for (let c = 0; c < 3; c++) out[o + c] = roundHalfEven(lut[v * 3 + c] * 255);
    } else {
      const r = rgba[s] / 255, g = rgba[s + 1] / 255, b = rgba[s + 2] / 255;
      const lightness = (r + g + b) / 3;
      const shade = shadeFloor + (1.0 - shadeFloor) * lightness;
      const t = v / 255;
      const alpha = opacity * (signed ? Math.abs(2.0 * t - 1.0) : t);
      const image = [r, g, b];
      for (let c = 0; c < 3; c++) {
        const blended = (1.0 - alpha) * image[c] + alpha * (lut[v * 3 + c] * shade);
        out[o + c] = roundHalfEven(Math.min(Math.max(blended, 0.0), 1.0) * 255);
      }
    }
    out[o + 3] = 255;
  }
  if (outline) drawOutline(out, outline, imageMove, Math.round(Math.sqrt(n)));
}

// The boundary of the nuclei mask (a pixel inside with a neighbour outside) in white.
function drawOutline(out, mask, move, size) {
  const inside = (i, j) => i >= 0 && j >= 0 && i < size && j < size && mask[move[i * size + j] * 4] > 127;
  for (let i = 0; i < size; i++) {
    for (let j = 0; j < size; j++) {
      if (!inside(i, j)) continue;
      if (inside(i - 1, j) && inside(i + 1, j) && inside(i, j - 1) && inside(i, j + 1)) continue;
      const o = (i * size + j) * 4;
      for (let c = 0; c < 3; c++) out[o + c] = Math.round(0.1 * out[o + c] + 0.9 * 255);
    }
  }
}

function svgMarks(data) {
  const s = data.size;
  let marks = "";
  if (data.border) {
    const b = data.border;
    marks += `<rect x="${b}" y="${b}" width="${s - 2 * b}" height="${s - 2 * b}" class="border"/>`;
  }
  if (data.centre) {
    const [top, left, side] = data.centre;
    marks += `<rect x="${left}" y="${top}" width="${side}" height="${side}" class="centre"/>`;
  }
  if (data.bar) {
    const y = s - 0.06 * s + 0.5, x1 = s - 0.05 * s + 0.5;
    marks += `<line x1="${x1 - data.bar.px}" x2="${x1}" y1="${y}" y2="${y}" class="bar"/>`;
    marks += `<text x="${x1 - data.bar.px / 2}" y="${y - 0.03 * s}" class="bar-label">${data.bar.label}</text>`;
  }
  return `<svg viewBox="0 0 ${s} ${s}" preserveAspectRatio="none">${marks}</svg>`;
}

function colourBar(data) {
  const canvas = document.createElement("canvas");
  canvas.width = 1;
  canvas.height = 256;
  const context = canvas.getContext("2d");
  const strip = context.createImageData(1, 256);
  for (let v = 0; v < 256; v++) {
    const o = (255 - v) * 4;
    for (let c = 0; c < 3; c++) strip.data[o + c] = Math.round(data.lut[v * 3 + c] * 255);
    strip.data[o + 3] = 255;
  }
  context.putImageData(strip, 0, 0);
  const digits = Math.max(2, Math.ceil(-Math.log10(Math.max(data.high - data.low, 1e-12))) + 1);
  const tick = (v) => Number(v).toFixed(Math.min(digits, 6));
  const bar = document.createElement("div");
  bar.className = "colour-bar";
  bar.innerHTML = `<div class="ticks"><span>${tick(data.high)}</span><span>${tick((data.low + data.high) / 2)}</span>`
    + `<span>${tick(data.low)}</span></div><div class="title">${data.colourTitle}</div>`;
  bar.prepend(canvas);
  return bar;
}

function button(text, dataset, title) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = text;
  element.title = title;
  Object.assign(element.dataset, dataset);
  return element;
}

function elementOf(turn, mirror) {
  return turn / 90 + (mirror ? 4 : 0);
}

export default function ({ data, parentElement, setTriggerValue }) {
  if (data.feed) {
    feed(data);
    return () => {};
  }
  if (!shownBy.has(data.viewer)) shownBy.set(data.viewer, { element: 0 });
  const shown = shownBy.get(data.viewer);
  const root = document.createElement("div");
  root.className = "turn-viewer";
  root.viewerData = data; // what it draws from, for the browser test to recompute a frame
  const controls = document.createElement("div");
  controls.className = "controls";
  const turns = [0, 90, 180, 270].map((degrees) => button(`${degrees}°`, { turn: String(degrees) },
    `Show the image turned by ${degrees}° counter-clockwise (no new computation)`));
  const label = document.createElement("span");
  label.className = "label";
  label.textContent = "Turn the image";
  controls.append(label, ...turns);
  const mirror = data.mirrors
    ? button("Mirror", { mirror: "" }, "Flip the rows after turning (the p4m group's mirrors)") : null;
  const play = data.canTurn
    ? button("▶ Watch it turn", { play: "" }, "Turn the image through 360° in 5° steps (batched passes of the "
      + "network) and play it: exact at quarter turns, approximate in between, where the pixels are resampled")
    : null;
  controls.append(...[mirror, play].filter(Boolean));
  const status = document.createElement("span");
  status.className = "status";
  controls.append(status);

  const grid = document.createElement("div");
  grid.className = `panels ${data.style}`;
  const count = data.titles.length;
  const columns = Math.min(count, 4);
  grid.style.gridTemplateColumns = `repeat(${columns + (data.style === "side" ? 1 : 0)}, minmax(0, 190px))`;
  const panels = [];
  const images = [];
  for (let h = 0; h < count; h++) {
    if (data.style === "side" && h % columns === 0) {
      const cell = document.createElement("figure");
      cell.innerHTML = `<figcaption>image</figcaption><div class="frame"><canvas></canvas></div>`;
      grid.append(cell);
      images.push(cell.querySelector("canvas"));
    }
    const cell = document.createElement("figure");
    cell.innerHTML = `<figcaption>${data.titles[h]}</figcaption><div class="frame"><canvas data-panel="${h}"></canvas>`
      + `${svgMarks(data)}</div>`;
    grid.append(cell);
    panels.push(cell.querySelector("canvas"));
  }
  const tooltip = document.createElement("div");
  tooltip.className = "tooltip";
  const body = document.createElement("div");
  body.className = "body";
  body.append(grid, colourBar(data));
  root.append(controls, body, tooltip);
  // Into the component's own markup: the shadow root also holds the style sheet Streamlit put there.
  parentElement.querySelector(".turn-viewer-host").replaceChildren(root);

  const size = data.size;
  for (const canvas of [...panels, ...images]) {
    canvas.width = size;
    canvas.height = size;
  }
  const ready = Promise.all([
    pixelsOf(data.image, size),
    Promise.all(data.maps.map((row) => Promise.all(row.map((url) => pixelsOf(url, size))))),
    data.outlines ? pixelsOf(data.outlines, size) : Promise.resolve(null),
  ]);
  let current = { rgba: null, maps: null, outlines: null };
  const quantised = []; // per panel, the q of the shown element (for the tooltip)

  function draw(t) {
    const { rgba, maps, outlines } = current;
    const move = data.moves[t];
    const imageMove = moveOf(size, data.elements[t]);
    const mapMove = moveOf(size, move.element);
    for (let h = 0; h < count; h++) {
      const context = panels[h].getContext("2d");
      const frame = context.createImageData(size, size);
      const q = maps[move.source][move.orientations[h]];
      blendPanel(frame.data, rgba, q, imageMove, mapMove, data, outlines);
      context.putImageData(frame, 0, 0);
      quantised[h] = { q, mapMove };
    }
    for (const canvas of images) {
      const context = canvas.getContext("2d");
      const frame = context.createImageData(size, size);
      for (let p = 0; p < imageMove.length; p++) {
        for (let c = 0; c < 4; c++) frame.data[p * 4 + c] = rgba[imageMove[p] * 4 + c];
      }
      context.putImageData(frame, 0, 0);
    }
    const element = data.elements[t];
    for (const button of turns) button.setAttribute("aria-pressed", String(Number(button.dataset.turn) === 90 * (element % 4)));
    if (mirror) mirror.setAttribute("aria-pressed", String(element >= 4));
    const probabilities = data.probabilities[t];
    const top = probabilities.indexOf(Math.max(...probabilities));
    status.textContent = `g = ${data.elementNames[t]}: ${data.classNames[top]}, p = ${probabilities[top].toFixed(3)}`;
    root.dataset.element = String(element);
  }

  function show(element) {
    const t = data.elements.indexOf(element);
    if (t < 0 || !current.rgba) return;
    stopPlaying();
    shown.element = element;
    draw(t);
  }

  // The animation: frames decoded as their chunks arrive, then one every FRAME_MS from the first; a frame not yet
  // arrived is waited for. At quarter turns the exact frames.
  const FRAME_MS = 90;
  const total = data.animation ? data.animation.frames : 0;
  const frames = []; // frame i -> { degrees, image, maps, deviation, typical }, once decoded
  let complete = null; // resolves once every frame is decoded (for the browser test)
  let timer = null;
  const identity = moveOf(size, 0);

  function decodedFrames() {
    let n = 0;
    while (n < total && frames[n]) n++;
    return n;
  }

  function takeChunk(chunk) {
    chunk.degrees.forEach((degrees, j) => {
      const i = chunk.start + j;
      if (frames[i] || i >= total) return;
      Promise.all([pixelsOf(chunk.images[j], size), pixelsOf(chunk.maps[j], size * count, size)]).then(
        ([image, maps]) => {
          frames[i] = { degrees, image, maps, deviation: chunk.deviations[j], typical: chunk.typicalDeviations[j] };
          if (decodedFrames() === total) {
            root.dataset.frames = String(total);
            arrived.resolve();
          }
        });
    });
  }

  const cleanups = [];
  const arrived = {};
  complete = new Promise((resolve) => { arrived.resolve = resolve; });
  if (data.animation) {
    const name = `${data.viewer}|${data.animation.key}`;
    for (const chunk of (chunksOf.get(name) || new Map()).values()) takeChunk(chunk);
    const onChunk = (event) => takeChunk(event.detail);
    arrivals.addEventListener(name, onChunk);
    cleanups.push(() => arrivals.removeEventListener(name, onChunk));
  }

  function drawTurned(i) {
    const { degrees, image, maps, deviation, typical } = frames[i];
    root.dataset.frame = String(i);
    if (degrees % 90 === 0) {
      draw(data.elements.indexOf(degrees / 90));
      status.textContent = `${degrees}°: a quarter turn, a group element: the maps are exact`;
      return;
    }
    for (let h = 0; h < count; h++) {
      const context = panels[h].getContext("2d");
      const frame = context.createImageData(size, size);
      const q = panelOf(maps, h, count, size);
      blendPanel(frame.data, image, q, identity, identity, data, null);
      context.putImageData(frame, 0, 0);
      quantised[h] = { q, mapMove: identity };
    }
    status.textContent = `${degrees}°: not a group element; the image was resampled and the maps follow it `
      + `approximately: off by ${(100 * typical).toFixed(1)} % on average (worst pixel ${(100 * deviation).toFixed(0)} %)`;
  }

  function stopPlaying() {
    if (timer !== null) clearInterval(timer);
    timer = null;
    if (play) play.textContent = "▶ Watch it turn";
  }

  function startPlaying() {
    if (!alive) return;
    stopPlaying();
    const before = shown.element;
    let i = 0;
    play.textContent = "■ Stop";
    timer = setInterval(() => {
      if (i >= total) {
        stopPlaying();
        shown.element = before;
        draw(data.elements.indexOf(before));
        return;
      }
      if (!frames[i]) {
        status.textContent = `Turning the image through 360°: ${decodedFrames()} of ${total} steps computed ...`;
        return;
      }
      drawTurned(i++);
    }, FRAME_MS);
  }

  if (play) {
    play.addEventListener("click", () => {
      if (timer !== null) {
        stopPlaying();
        draw(data.elements.indexOf(shown.element));
      } else if (data.animation) {
        startPlaying();
      } else {
        play.disabled = true;
        status.textContent = "Turning the image through 360° ...";
        setTriggerValue("turn", true);
      }
    });
  }
  // For the browser test: draw frame i of the animation, or list its frames' count once decoded.
  root.showFrame = async (i) => {
    await complete;
    stopPlaying();
    drawTurned(i);
  };

  for (const button of turns) {
    button.addEventListener("click", () => show(elementOf(Number(button.dataset.turn), shown.element >= 4)));
  }
  if (mirror) mirror.addEventListener("click", () => show(elementOf(90 * (shown.element % 4), shown.element < 4)));

  grid.addEventListener("mousemove", (event) => {
    const canvas = event.target.closest ? event.target.closest(".frame")?.querySelector("canvas[data-panel]") : null;
    if (!canvas || !quantised.length) {
      tooltip.style.display = "none";
      return;
    }
    const box = canvas.getBoundingClientRect();
    const row = Math.floor(((event.clientY - box.top) / box.height) * size);
    const col = Math.floor(((event.clientX - box.left) / box.width) * size);
    if (row < 0 || col < 0 || row >= size || col >= size) return;
    const { q, mapMove } = quantised[Number(canvas.dataset.panel)];
    const v = q[mapMove[row * size + col] * 4];
    const value = data.low + (v / 255) * (data.high - data.low);
    const step = (data.high - data.low) / 510;
    tooltip.textContent = `row ${row}, col ${col}: ${value.toFixed(3)} (± ${step.toPrecision(1)})`;
    tooltip.style.display = "block";
    const rootBox = root.getBoundingClientRect();
    tooltip.style.left = `${event.clientX - rootBox.left + 12}px`;
    tooltip.style.top = `${event.clientY - rootBox.top + 12}px`;
  });
  grid.addEventListener("mouseleave", () => {
    tooltip.style.display = "none";
  });

  let alive = true;
  ready.then(([rgba, maps, outlines]) => {
    if (!alive) return;
    current = { rgba, maps, outlines };
    show(data.elements.includes(shown.element) ? shown.element : 0);
    root.dataset.ready = "1";
    // A new animation (the button asked the server for it) plays once as soon as it arrives.
    if (data.animation && playedBy.get(data.viewer) !== data.animation.key) {
      playedBy.set(data.viewer, data.animation.key);
      startPlaying();
    }
  });
  return () => {
    alive = false;
    for (const cleanup of cleanups) cleanup();
    stopPlaying();
  };
}
