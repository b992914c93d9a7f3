"""``core.warnings.warning_html``: a warning's text and its action's link, both escaped, linked only to a page of
this app (a stored action is data: an address of another site, or a script, is left as text)."""
from webapp.core.warnings import ActionWarning, warning_html


def test_it_links_an_action_warning_escaping_both():
    warning = ActionWarning("data.eval: <b>held</b> shares 1 row", url="/p/alpha/datasets/ds_1/v/1/?a=1&b=2",
                            label="Remove them from <i>qa</i> v1")
    assert warning_html(warning) == ('data.eval: &lt;b&gt;held&lt;/b&gt; shares 1 row <a class="warning-action" '
                                     'href="/p/alpha/datasets/ds_1/v/1/?a=1&amp;b=2">Remove them from &lt;i&gt;qa'
                                     '&lt;/i&gt; v1</a>')


def test_a_plain_warning_or_another_sites_address_is_text_alone():
    assert warning_html("disk: <b>full</b>") == "disk: &lt;b&gt;full&lt;/b&gt;"
    for url in ("//evil.example/", "https://evil.example/", "javascript:alert(1)", "/\\evil.example", ""):
        assert warning_html("w", {"url": url, "label": "go"}) == "w", url
    assert warning_html("w", {"url": "/p/alpha/", "label": "go"}).endswith('href="/p/alpha/">go</a>')
