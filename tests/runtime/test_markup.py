"""HTML in, HTML out (twostep/runtime/markup.py): which text nodes are translated, what is kept as written, what
is escaped, and the broken markup that is refused."""

from __future__ import annotations

import pytest

from twostep.errors import BadInput
from twostep.runtime.markup import parse_html

# each as a page writes it: <script> and <style> raw, <code> and <pre> with their entities (and a tag inside)
KEPT = {"code": "x = a &lt; <b>b</b> &amp;&amp; c;", "pre": "if a &lt; b:\n    <i>return</i> c &amp; d\n",
        "script": 'if (a < b && c) { say("<p>hi</p>"); }', "style": 'p > b::after { content: "&amp; <"; }'}


@pytest.mark.parametrize("tag", sorted(KEPT))
def test_code_pre_script_and_style_are_left_untranslated_and_unchanged(tag):
    page = f"<p>Good morning.</p><{tag}>{KEPT[tag]}</{tag}><p>See you.</p>"
    markup = parse_html(page)
    assert markup.sources() == ["Good morning.", "See you."]
    assert markup.join(["Guten Morgen.", "Bis bald."]) == \
        f"<p>Guten Morgen.</p><{tag}>{KEPT[tag]}</{tag}><p>Bis bald.</p>"


@pytest.mark.parametrize("page, where", [("<div>Good <b>morning</b>.", "<div> at line 1, column 1"),
                                         ("<p>One.</p>\n<p>Two <em>three.</p>", "<em> at line 2, column 8")])
def test_an_unclosed_tag_is_refused_naming_it(page, where):
    with pytest.raises(BadInput) as refused:
        parse_html(page)
    message = str(refused.value)
    assert message.startswith(f"format html: the markup is broken: {where} ")
    assert message.endswith("; send well-formed HTML, or format text") and message.count("\n") == 0
    assert parse_html("<ul><li>Good <b>morning</b>.<li>See you.</ul><p>Bye.").sources() == [
        "Good ", "morning", ".", "See you.", "Bye."]  # <li> and <p> may be left open, as HTML lets them


def test_a_translation_with_ampersands_and_angle_brackets_is_escaped():
    markup = parse_html('<p title="a &amp; b">Fish &amp; chips &lt;3</p>')
    assert markup.sources() == ["Fish & chips <3"]  # entities read as the characters they stand for
    assert markup.join(["Fisch & <Pommes> <3"]) == '<p title="a &amp; b">Fisch &amp; &lt;Pommes&gt; &lt;3</p>'
