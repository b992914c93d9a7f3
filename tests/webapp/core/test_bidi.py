"""Balancing the bidi controls of people's text (``webapp.core.bidi``): worked out by hand on short
strings, then on a page: a hostile run name's controls are closed inside its own text."""
import gzip
import random
import re
from pathlib import Path

import pytest
from django.http import FileResponse, HttpResponse, HttpResponseNotModified, JsonResponse
from django.test import RequestFactory

from tests.webapp.factories import make_base_model
from webapp.core.bidi import (
    CONTROLS, EMBEDDINGS, FSI, ISOLATES, LRI, PDF, PDI, RLE, RLO, BidiBalanceMiddleware, balance_bidi_controls,
    balance_html_text, isolated)
from webapp.runs.models import Run, RunStatus

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("text, balanced", [
    ("plain", "plain"),
    (f"a{RLO}b", f"a{RLO}b{PDF}"),                          # an override left open is closed
    (f"a{PDI}{RLO}b{LRI}c", f"a{RLO}b{LRI}c{PDI}{PDF}"),    # a stray PDI dropped; closed innermost first
    (f"{FSI}x{PDI}", f"{FSI}x{PDI}"),                       # balanced text passes unchanged
    (f"{PDF}x", "x"),                                       # a PDF that closes nothing
    (f"{LRI}{RLE}x{PDI}y", f"{LRI}{RLE}x{PDI}y"),           # the PDI closes the embedding inside it too
    (f"{LRI}x{PDF}y", f"{LRI}xy{PDI}"),                     # a PDF does not reach out of an isolate
])
def test_it_pairs_every_control(text, balanced):
    assert balance_bidi_controls(text) == balanced


def test_it_balances_each_text_run_and_leaves_tags_scripts_and_textareas_alone():
    html = (f'<h1 title="t{RLO}">name{RLO}</h1> v1<script>var s = "{LRI}";</script>'
            f"<textarea>{RLO}</textarea><!-- {RLO} -->")
    assert balance_html_text(html) == (f'<h1 title="t{RLO}">name{RLO}{PDF}</h1> v1<script>var s = "{LRI}";</script>'
                                       f"<textarea>{RLO}</textarea><!-- {RLO} -->")


# The first algorithm (a Python step per tag, then per character of each run), kept as the
# specification that balance_html_text's faster scan must match exactly.
_REFERENCE_OPAQUE = re.compile(r"<(script|style|textarea)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", re.DOTALL | re.IGNORECASE)


def _reference_balance(text: str) -> str:
    out: list[str] = []
    opened: list[str] = []
    for char in text:
        if char in EMBEDDINGS or char in ISOLATES:
            opened.append(char)
        elif char == PDF:
            if not opened or opened[-1] not in EMBEDDINGS:
                continue
            opened.pop()
        elif char == PDI:
            if not any(opener in ISOLATES for opener in opened):
                continue
            while opened.pop() not in ISOLATES:
                pass
        out.append(char)
    out.extend(PDI if opener in ISOLATES else PDF for opener in reversed(opened))
    return "".join(out)


def _reference_balance_html_text(html: str) -> str:
    pieces: list[str] = []
    start = 0
    for opaque in _REFERENCE_OPAQUE.finditer(html):
        pieces.append(_reference_balance(html[start:opaque.start()]))
        pieces.append(opaque.group(0))
        start = opaque.end()
    pieces.append(_reference_balance(html[start:]))
    return "".join(pieces)


# Pieces of hostile pages: tags that open and close in every way the scan knows, a "<" that begins
# no tag, unclosed comments and scripts, attributes, and every control.
_PIECES = ["<b>", "</b>", '<a title="', '">', "<script>", "</script>", "<SCRIPT type=x>", "</script >", "<textarea>",
           "</TextArea>", "<style>", "</style>", "<scripts>", "<!--", "-->", "<", ">", "a < b", "text", " ", "\n",
           "&lt;", *(chr(code) for code in (*range(0x202a, 0x202f), *range(0x2066, 0x206a)))]


def test_the_fast_scan_balances_exactly_as_the_first_algorithm_did():
    generator = random.Random(20261201)
    samples = [(f"<tr><td><a href='/r/1/' title='t{RLO}'>evil{PDI}{RLO}name{LRI}</a> <span>r_1</span></td>"
                f"<td>{RLO}x</td></tr>" * 50 + f"<textarea>{RLO}</textarea><script>if (a < b) {{ s = '{LRI}'; }}</script>"),
               f"{RLO}before any tag", f"<p>{PDF}{PDI}</p>< {RLO}", f"<!-- {RLO} never closed <p>{RLO}",
               f"<script>{RLO} never closed <p>{RLO}</p>"]
    samples += ["".join(generator.choices(_PIECES, k=generator.randint(0, 80))) for _ in range(3000)]
    for sample in samples:
        assert balance_html_text(sample) == _reference_balance_html_text(sample), repr(sample)
        assert balance_bidi_controls(sample) == _reference_balance(sample), repr(sample)


def test_a_page_closes_a_hostile_name_inside_its_own_text(team, client_for):
    run = Run.objects.create(project=team.project, name=f"evil{PDI}{RLO}", task="sft", status=RunStatus.FAILED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": "/nowhere"}, created_by=team.owner)
    page = client_for(team.viewer).get(f"/p/alpha/runs/{run.public_id}/").content.decode()
    assert f"<bdi>evil{RLO}{PDF}</bdi>" in page and f"{PDI}{RLO}" not in page


def test_the_templates_hold_no_bidi_controls_of_their_own():
    """The balancing treats every control on a page as data's."""
    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / "templates").rglob("*.html")
                 if CONTROLS.search(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_a_name_in_a_flash_message_is_isolated(team, client_for):
    """A right-to-left name (new names hold no bidi control, below) would carry the words after it along."""
    assert isolated(f"evil{PDI}{RLO}") == f"{FSI}evil{RLO}{PDF}{PDI}"
    response = client_for(team.owner).post("/projects/new/", {"name": "שלום 2", "slug": "evil"}, follow=True)
    assert f"Project {FSI}שלום 2{PDI} created." in response.content.decode()


def test_a_name_in_the_page_title_and_in_an_option_label_is_isolated(team, client_for):
    """Neither a <title> nor an <option> can hold an element: the name is wrapped in FSI…PDI, so the
    words after it are outside the override, and it is still escaped."""
    make_base_model(team.project, name=f"<b>evil{RLO}")
    run = Run.objects.create(project=team.project, name=f"evil{RLO}", task="sft", status=RunStatus.FAILED,
                             spec={"task": "sft"}, resolved_spec={"output_dir": "/nowhere"}, created_by=team.owner)
    client = client_for(team.owner)
    page = client.get(f"/p/alpha/runs/{run.public_id}/").content.decode()
    assert f"<title>{FSI}evil{RLO}{PDF}{PDI} · {FSI}Project alpha{PDI} · Temper</title>" in page
    launch = client.get("/p/alpha/runs/new/?task=sft").content.decode()
    assert f"{FSI}&lt;b&gt;evil{RLO}{PDF}{PDI} (base model)</option>" in launch
    chat = client.get("/p/alpha/chat/").content.decode()
    assert f"Base model: {FSI}&lt;b&gt;evil{RLO}{PDF}{PDI}</option>" in chat


def _through_middleware(response: HttpResponse, method: str = "GET") -> HttpResponse:
    return BidiBalanceMiddleware(lambda request: response)(RequestFactory().generic(method, "/page/"))


def test_a_compressed_page_is_passed_on_byte_for_byte():
    """A gzip body is not text: stored (level 0) it holds the UTF-8 bytes of an RLO, which a
    rewrite would cut out of the stream and corrupt it."""
    page = f"<p>name{RLO}</p>".encode()
    compressed = gzip.compress(page, compresslevel=0)
    response = HttpResponse(compressed, content_type="text/html; charset=utf-8")
    response["Content-Encoding"] = "gzip"
    assert _through_middleware(response).content == compressed
    assert gzip.decompress(response.content) == page


def test_a_page_in_another_charset_is_balanced_in_it_and_one_that_does_not_decode_is_passed_on():
    response = _through_middleware(HttpResponse(f"<p>name{RLO}</p>".encode("utf-16"),
                                                content_type="text/html; charset=utf-16"))
    assert response.content.decode("utf-16") == f"<p>name{RLO}{PDF}</p>"
    truncated = f"<p>name{RLO}</p>".encode("utf-16") + b"x"  # an odd byte: not UTF-16
    assert _through_middleware(HttpResponse(truncated, content_type="text/html; charset=utf-16")).content == truncated
    unknown = HttpResponse(f"<p>{RLO}</p>".encode(), content_type="text/html; charset=x-no-such-codec")
    assert _through_middleware(unknown).status_code == 200 and unknown.content == f"<p>{RLO}</p>".encode()


def test_the_content_length_follows_the_rewritten_body_and_json_and_files_are_left_alone(tmp_path):
    page = HttpResponse(f"<p>{RLO}x</p>", content_type="text/html; charset=utf-8")
    page["Content-Length"] = str(len(page.content))
    assert _through_middleware(page, "HEAD")["Content-Length"] == str(len(f"<p>{RLO}x{PDF}</p>".encode()))
    data = JsonResponse({"name": f"x{RLO}"})
    assert _through_middleware(data).content == data.content
    (tmp_path / "page.html").write_text(f"<p>{RLO}</p>")
    served = _through_middleware(FileResponse((tmp_path / "page.html").open("rb"), content_type="text/html"))
    assert b"".join(served.streaming_content) == f"<p>{RLO}</p>".encode()
    assert _through_middleware(HttpResponseNotModified()).content == b""


def test_a_new_name_with_a_bidi_control_is_refused(team, client_for):
    """Names are isolated where they are shown (above), and new ones hold no invisible control at all."""
    response = client_for(team.owner).post("/projects/new/", {"name": f"evil{RLO}", "slug": "evil"})
    assert response.status_code == 400 and "U+202E (RIGHT-TO-LEFT OVERRIDE), at position 5" in response.content.decode()
