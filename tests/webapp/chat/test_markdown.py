"""A finished answer's Markdown: the lines the model wrote stay lines (as they were while it streamed)."""
from webapp.chat.templatetags.chat import model_markdown
from webapp.runs.markup import render_markdown

ANSWER = "Question: 2 + 2?\nAnswer: 4\nQuestion: 3 + 3?\nAnswer: 6\n\n```\nx = 1\ny = 2\n```\n<script>alert(1)</script>"


def test_an_answers_lines_stay_lines():
    """Markdown joined them into one paragraph once the answer was done: 'Answer: 4 Question: 3 + 3?'."""
    html = str(model_markdown(ANSWER))
    assert "<p>Question: 2 + 2?<br>\nAnswer: 4<br>\nQuestion: 3 + 3?<br>\nAnswer: 6</p>" in html
    assert "<pre><code>x = 1\ny = 2\n</code></pre>" in html  # code keeps its own line breaks, no <br>
    assert "<script" not in html and "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>" in html


def test_raw_html_an_answer_writes_is_shown_as_text():
    """It was sanitized away: an answer about HTML tags lost the tags it named ('<details>' vanished)."""
    html = str(model_markdown("Wrap it in <details>.\n\n<img src=x onerror=alert(1)>\n\n`<div>` and **bold**"))
    assert "Wrap it in &lt;details&gt;." in html and "<p>&lt;img src=x onerror=alert(1)&gt;</p>" in html
    assert "<code>&lt;div&gt;</code>" in html and "<strong>bold</strong>" in html
    assert "<img" not in html and "<details" not in html
    assert str(render_markdown("[x](javascript:alert(1))")) == '<p><a rel="noopener noreferrer">x</a></p>'


def test_notes_and_guidelines_stay_plain_markdown():
    assert str(render_markdown("one\ntwo")) == "<p>one\ntwo</p>"
