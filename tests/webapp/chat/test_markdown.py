"""A finished answer's Markdown: the lines the model wrote stay lines (as they were while it streamed)."""
from webapp.chat.templatetags.chat import model_markdown
from webapp.runs.markup import render_markdown

ANSWER = "Question: 2 + 2?\nAnswer: 4\nQuestion: 3 + 3?\nAnswer: 6\n\n```\nx = 1\ny = 2\n```\n<script>alert(1)</script>"


def test_an_answers_lines_stay_lines():
    """Markdown joined them into one paragraph once the answer was done: 'Answer: 4 Question: 3 + 3?'."""
    html = str(model_markdown(ANSWER))
    assert "<p>Question: 2 + 2?<br>\nAnswer: 4<br>\nQuestion: 3 + 3?<br>\nAnswer: 6</p>" in html
    assert "<pre><code>x = 1\ny = 2\n</code></pre>" in html  # code keeps its own line breaks, no <br>
    assert "<script" not in html


def test_notes_and_guidelines_stay_plain_markdown():
    assert str(render_markdown("one\ntwo")) == "<p>one\ntwo</p>"
