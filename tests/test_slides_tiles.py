"""The slides' deep-zoom tiles beside the app on the same port (``app/server.py``, :mod:`app.slides.tiles`), on a
real server with the real demo slides: the descriptor, tiles as JPEG, and a 404 with a sentence, never a file
outside the listing, for anything else."""

from __future__ import annotations

import hashlib
import io
import time
import urllib.error
import urllib.request
from xml.etree import ElementTree

import pytest
from PIL import Image

from app.slides.library import DEMO_FOLDER, find_slide, list_slides, save_upload
from app.slides.reader import SlideError
from app.slides.tiles import VENDOR, VENDOR_CACHE, inline_descriptor
from benchmarks.concurrent_sessions import free_port, streamlit_server
from tests.conftest import REPO, require_shared


def fetch(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type", ""), err.read()


def test_an_upload_is_kept_by_its_digest_found_by_id_and_bad_ones_are_refused_keeping_nothing(tmp_path, monkeypatch):
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    monkeypatch.setenv("APP_SLIDE_UPLOADS", str(tmp_path / "uploads"))
    monkeypatch.setenv("APP_SLIDES", str(tmp_path / "none"))
    data = (DEMO_FOLDER / "CMU-1-Small-Region.svs").read_bytes()
    entry = save_upload("../../my slide.svs", data, limit_bytes=len(data))
    assert entry.name == "../../my slide.svs" and entry.path.parent == tmp_path / "uploads"
    assert entry.path.name == hashlib.sha256(data).hexdigest()[:32] + ".svs" and entry.path.read_bytes() == data
    assert find_slide(entry.slide_id).path == entry.path, "the tile routes find an upload by its id"
    assert entry.slide_id not in {e.slide_id for e in list_slides()}, "others are not shown it"
    assert save_upload("again.svs", data, len(data)).slide_id == entry.slide_id, "the same bytes: the same slide"
    refused = {
        "over.svs": (data, len(data) - 1, "over this server's upload limit of"),
        "photo.svs": (b"\xff\xd8\xff\xe0" + bytes(100), 10**6, "photo.svs is not a slide"),
        "cut.svs": (data[:len(data) // 3], 10**6 * 10, "cut.svs"),
        "index.mrxs": (b"x", 10, "MIRAX and VMS slides are folders"),
        "empty.tif": (b"", 10, "empty.tif is empty"),
    }
    for name, (content, limit, sentence) in refused.items():
        with pytest.raises(SlideError, match=sentence.replace(".", r"\.")):
            save_upload(name, content, limit)
    assert sorted(p.name for p in (tmp_path / "uploads").iterdir()) == [entry.path.name], "nothing else kept"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    require_shared(DEMO_FOLDER / "CMU-1-Small-Region.svs", f"{DEMO_FOLDER} not found (the demo slides)")
    log = tmp_path_factory.mktemp("server") / "server.log"
    with streamlit_server(REPO / "checkpoints", log, free_port(), time.monotonic() + 120) as (_, url):
        yield url


def test_the_listing_names_slides_by_id_and_finds_only_those(tmp_path):
    (tmp_path / "mine.svs").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not a slide")
    entries = list_slides(tmp_path, DEMO_FOLDER)
    assert [e.name for e in entries if not e.demo] == ["mine.svs"]
    assert len({e.slide_id for e in entries}) == len(entries)
    assert find_slide(entries[0].slide_id, entries) == entries[0] and find_slide("../mine.svs", entries) is None


def test_a_slide_is_served_as_deep_zoom_tiles(served):
    cmu = next(e for e in list_slides() if e.name == "CMU-1-Small-Region.svs")
    status, kind, body = fetch(f"{served}slides/{cmu.slide_id}.dzi")
    assert (status, kind) == (200, "application/xml") and b'Width="2220" Height="2967"' in body
    status, kind, body = fetch(f"{served}slides/{cmu.slide_id}_files/12/4_5.jpeg")
    assert (status, kind) == (200, "image/jpeg") and Image.open(io.BytesIO(body)).size == (256, 256)


@pytest.mark.parametrize(("path", "sentence"), [
    ("slides/0123456789abcdef.dzi", b"no slide is listed under this id"),
    ("slides/{cmu}_files/40/0_0.jpeg", b"has deep-zoom levels 0 to 12, not 40"),
    ("slides/{cmu}_files/12/99_0.jpeg", b"has 9 x 12 tiles, not (99, 0)"),
])
def test_what_does_not_exist_is_a_404_with_a_sentence(served, path, sentence):
    cmu = next(e for e in list_slides() if e.name == "CMU-1-Small-Region.svs")
    status, _, body = fetch(served + path.format(cmu=cmu.slide_id))
    assert status == 404 and sentence in body and b"Traceback" not in body


def test_no_path_reaches_a_file_outside_the_listing(served):
    for path in ("slides/..%2F..%2Fetc%2Fpasswd.dzi", "slides/../../etc/passwd", "vendor/../requirements.txt"):
        status, _, body = fetch(served + path)
        assert status != 200 or b"torch==" not in body and b"root:" not in body, path


def test_openseadragon_is_served_where_make_installed_it_and_kept_a_day(served):
    if not (VENDOR / "openseadragon").is_dir():
        pytest.skip("make vendor has not installed OpenSeadragon here")
    status, _, body = fetch(f"{served}vendor/openseadragon/openseadragon.min.js")
    assert status == 200 and b"OpenSeadragon" in body[:2000]
    request = urllib.request.Request(f"{served}vendor/openseadragon/openseadragon.min.js",
                                     headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Cache-Control"] == VENDOR_CACHE
        assert response.headers["Content-Encoding"] == "gzip" and len(response.read()) < len(body) / 2


def test_the_inline_descriptor_is_the_dzi_routes(served):
    """The Slide page hands the viewer the descriptor the .dzi route serves, with the URL of the same tiles."""
    cmu = next(e for e in list_slides() if e.name == "CMU-1-Small-Region.svs")
    _, _, body = fetch(f"{served}slides/{cmu.slide_id}.dzi")
    served_image = ElementTree.fromstring(body)
    image = inline_descriptor(cmu.slide_id)["Image"]
    assert served_image.tag == "{" + image["xmlns"] + "}Image"
    assert {name: image[name] for name in ("TileSize", "Overlap", "Format")} == served_image.attrib
    assert image["Size"] == served_image.find("{*}Size").attrib == {"Width": "2220", "Height": "2967"}
    status, kind, _ = fetch(f"{served}{image['Url']}12/4_5.jpeg")
    assert (status, kind) == (200, "image/jpeg") and image["Url"] == f"slides/{cmu.slide_id}_files/"
    assert inline_descriptor("0123456789abcdef") is None
