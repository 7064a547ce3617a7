"""Whole documents (twostep/runtime/documents.py and Translator's split=True): split into sentences, joined back
with the text between them kept, a sentence longer than the model takes cut into pieces that fit; on the demo
model, a document translates as its sentences do one by one."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twostep.errors import BadInput
from twostep.runtime.documents import DocumentPlan, cut, segmenter_language, split_documents
from twostep.runtime.translator import open_translator

bounded = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

words = st.sampled_from(["three", "Dr.", "e.g.", "3.5", "U.S.", "hundred", "and", "forty-two", '"Stop!"', "(yes)",
                         "…", "...", "Zoë", "naïve", "l'été", "Straße", "z.B.", "привет", "т.е.", "это", "3,000",
                         "10:30", "—", "测试", "東京", "これは", "テスト"])
ends = st.sampled_from([".", "!", "?", "", "。", "！", "?!", "...", ":", ";", ","])
separators = st.sampled_from([" ", "  ", "\n", "\n\n", "\n\n\n", "\t", " \n ", "\r\n", "", "\u3000", "\xa0"])
sentence = st.builds(lambda ws, end, joiners: "".join(w + j for w, j in zip(ws, joiners)).rstrip() + end,
                     st.lists(words, min_size=1, max_size=12), ends,
                     st.lists(st.sampled_from([" ", " ", "", ", ", "，", "; "]), min_size=12, max_size=12))
documents = st.builds(lambda lead, parts, trail: lead + "".join(s + sep for s, sep in parts) + trail,
                      separators, st.lists(st.tuples(sentence, separators), min_size=1, max_size=8), separators)
languages = st.sampled_from(["en", "fr", "de", "es", "zh", "ja", "ru", None, "fra_Latn", "xx"])


def characters(s: str) -> int:
    return len(s)


@settings(bounded)
@given(st.lists(documents, min_size=1, max_size=3), languages)
def test_joining_the_sentences_themselves_gives_back_each_text_exactly(texts, lang):
    sentences, plan = split_documents(texts, lang, characters, 10_000)
    assert plan.join(sentences) == texts
    assert all(s and s == s.strip() and "\n" not in s for s in sentences)  # a line break always ends a sentence


@settings(bounded)
@given(documents, st.integers(1, 40), languages)
def test_a_sentence_longer_than_the_limit_is_cut_into_pieces_that_fit_and_rejoin_to_it(text, limit, lang):
    sentences, plan = split_documents([text], lang, characters, limit)
    assert plan.join(sentences) == [text]
    assert all(len(s) <= limit for s in sentences)
    assert all(s and s == s.strip() for s in sentences)


def test_paragraphs_line_breaks_and_the_whitespace_around_sentences_are_kept():
    text = "  Dr. Smith arrived at 3 p.m. He left.\n\nA new paragraph!  Its second sentence?\n- one\n- two\n"
    sentences, plan = split_documents([text], "en", characters, 100)
    assert sentences == ["Dr. Smith arrived at 3 p.m.", "He left.", "A new paragraph!", "Its second sentence?",
                         "- one", "- two"]
    assert plan.documents[0].gaps == ("  ", " ", "\n\n", "  ", "\n", "\n", "\n")
    assert plan.join([s.upper() for s in sentences]) == [
        "  DR. SMITH ARRIVED AT 3 P.M. HE LEFT.\n\nA NEW PARAGRAPH!  ITS SECOND SENTENCE?\n- ONE\n- TWO\n"]


def test_a_line_break_ends_a_sentence_even_without_punctuation():
    assert split_documents(["seven\nthree hundred and two\n"], "en", characters, 100)[0] == [
        "seven", "three hundred and two"]


def test_a_long_sentence_is_cut_at_clause_punctuation_before_whitespace():
    sentence = "one two three four, five six seven eight nine ten eleven"
    assert cut(sentence) == (19, 20)  # after the comma (the middle is at 28), its space the gap
    sentences, plan = split_documents([sentence], "en", characters, 40)
    assert sentences == ["one two three four,", "five six seven eight nine ten eleven"]
    # no clause punctuation near the middle: the whitespace nearest it
    assert split_documents(["aa bb, cc dd ee ff gg hh ii jj kk"], "en", characters, 20)[0] == [
        "aa bb, cc dd ee", "ff gg hh ii jj kk"]
    assert cut("3,000 and 10:30 are no clauses") == (15, 16)


def test_text_without_whitespace_is_cut_between_characters_and_clause_marks_come_first():
    text = "今天天气很好我们去公园散步然后回家吃饭。"
    sentences, plan = split_documents([text], "zh", characters, 6)
    assert all(len(s) <= 6 for s in sentences) and len(sentences) > 1
    assert "".join(sentences) == text and plan.join(sentences) == [text]
    clause = "今天天气很好，我们一起去公园散步吧。"  # the comma ends character 7 of 18
    assert split_documents([clause], "zh", characters, 12)[0] == ["今天天气很好，", "我们一起去公园散步吧。"]
    assert cut("ae\u0301e") == (3, 3)  # never before a combining mark
    assert cut("a") is None


def test_text_without_whitespace_is_cut_at_its_middle_character_rounded_down():
    assert cut("一二三四五六七") == (3, 3) and cut("一二三四五六") == (3, 3)  # len // 2: the left part the shorter
    text = "今天天气很好我们去公园散步然后回家吃饭"  # 19 characters, no clause mark
    assert split_documents([text], "zh", characters, 10)[0] == ["今天天气很好我们去", "公园散步然后回家吃饭"]


def test_sentences_that_meet_without_a_space_after_a_wide_character_get_one_in_a_spaced_translation():
    text = "今天下雨。我在家。\n她走了。"
    sentences, plan = split_documents([text], "zh", characters, 100)
    assert sentences == ["今天下雨。", "我在家。", "她走了。"]
    assert plan.join(["It rains.", "I stay home.", "She left."]) == ["It rains. I stay home.\nShe left."]
    assert plan.join(["雨です。", "家にいます。", "彼女は去った。"]) == ["雨です。家にいます。\n彼女は去った。"]
    # not after a narrow character: Hi!Bye. stays as it was written
    sentences, plan = split_documents(["Hi!Bye."], "en", characters, 100)
    assert sentences == ["Hi!", "Bye."] and plan.join(["Salut !", "Au revoir."]) == ["Salut !Au revoir."]


def test_a_space_joins_two_sentences_only_where_both_translations_meet_in_a_spaced_script():
    for text in ("Hi!你好。", "你好。Hi!"):  # joined back as they are: no space where either side is wide
        sentences, plan = split_documents([text], "zh", characters, 100)
        assert len(sentences) == 2 and plan.join(sentences) == [text]
    sentences, plan = split_documents(["今天下雨。我在家。"], "zh", characters, 100)
    assert plan.join(["It rains.", "我在家。"]) == ["It rains.我在家。"]
    assert plan.join(["今天下雨。", "I stay home."]) == ["今天下雨。I stay home."]
    assert plan.join(["It rains.", "I stay home."]) == ["It rains. I stay home."]


def test_empty_texts_and_texts_that_are_not_text_are_bad_input():
    with pytest.raises(BadInput, match="^text 2 is empty$"):
        split_documents(["one.", " \n\n\t"], "en", characters, 100)
    with pytest.raises(BadInput, match="^text 1 is empty$"):
        split_documents([""], "en", characters, 100)
    with pytest.raises(BadInput, match="^text 2 is not text$"):
        split_documents(["one.", 7], "en", characters, 100)
    with pytest.raises(BadInput, match="text 1 is not valid Unicode"):
        split_documents(["a\ud800b"], "en", characters, 100)


@pytest.mark.parametrize("code, lang", [("fra_Latn", "fr"), ("fr_XX", "fr"), ("fra", "fr"), ("fr-FR", "fr"),
                                        ("zh-Hant", "zh"), ("zho_Hant", "zh"), ("ja_XX", "ja"), ("rus_Cyrl", "ru"),
                                        (None, "en"), ("", "en"), ("__fr__", "en"), (">>fra<<", "en")])
def test_the_segmenter_language_is_the_source_languages_own(code, lang):
    assert segmenter_language(code) == lang


def test_the_sentences_follow_the_source_languages_rules():
    text = "Das ist z. B. ein Test. Noch einer."
    assert split_documents([text], "deu_Latn", characters, 100)[0] == ["Das ist z. B. ein Test.", "Noch einer."]
    assert split_documents([text], "fr", characters, 100)[0] == ["Das ist z.", "B.", "ein Test.", "Noch einer."]


def test_nbest_keeps_a_one_sentence_texts_hypotheses_and_joins_a_documents_best():
    sentences, plan = split_documents(["  One.  ", "Two. Three.\n"], "en", characters, 100)
    nbest = [[("Eins.", -0.1), ("Ein.", -0.5)], [("Zwei.", -0.2), ("Zwo.", -0.9)], [("Drei.", -0.4)]]
    assert plan.join_nbest(nbest) == [[("  Eins.  ", -0.1), ("  Ein.  ", -0.5)],
                                      [("Zwei. Drei.\n", pytest.approx(-0.3))]]
    with pytest.raises(ValueError, match="2 translations for 3 sentences"):
        plan.join(["a", "b"])


def test_a_plan_is_the_documents_in_order():
    sentences, plan = split_documents(["One. Two.", "Three."], "en", characters, 100)
    assert isinstance(plan, DocumentPlan) and sentences == plan.sentences == ["One.", "Two.", "Three."]
    assert [d.sentences for d in plan.documents] == [("One.", "Two."), ("Three.",)]
    assert [d.text for d in plan.documents] == ["One. Two.", "Three."]


@pytest.fixture(scope="module")
def demo(demo_artifact):
    translator, backend = open_translator(demo_artifact, "ort-cpu", threads=1)
    with backend:
        yield translator


DOCUMENT = ("three hundred and forty-two. seven thousand and one.\n\n"
            "  nine hundred and ninety-nine!  twelve\n\n\nfive hundred and six.\n")


def test_a_document_translates_as_its_sentences_do_one_by_one(demo):
    def one(sentence):
        return demo.translate([sentence])[0]

    want = (f"{one('three hundred and forty-two.')} {one('seven thousand and one.')}\n\n"
            f"  {one('nine hundred and ninety-nine!')}  {one('twelve')}\n\n\n{one('five hundred and six.')}\n")
    assert demo.translate([DOCUMENT, "eleven."], split=True) == [want, one("eleven.")]
    assert want.startswith("dreihundertzweiundvierzig ")
    nbest = demo.translate_nbest([DOCUMENT, "eleven."], split=True)
    assert [[text for text, _ in hyps] for hyps in nbest] == [[want], [one("eleven.")]]
    with pytest.raises(BadInput, match="^text 2 is empty$"):
        demo.translate([DOCUMENT, "\n \n"], split=True)


def test_without_split_each_text_is_still_one_sentence(demo):
    whole = demo.translate_ids(demo.encode([DOCUMENT]))[0]
    assert demo.translate([DOCUMENT]) == demo.translate([DOCUMENT], split=False) == [demo.tokenizer.decode(whole)]
    assert demo.translate([DOCUMENT], split=False) != demo.translate([DOCUMENT], split=True)


def test_a_sentence_longer_than_max_positions_is_translated_in_pieces_that_fit(demo):
    long = ", ".join(["seven hundred and seventy-seven thousand"] * 30) + "."
    assert len(demo.encode([long])[0]) > demo.limits.max_positions
    with pytest.raises(BadInput, match="at most 128 \\(max_positions\\)"):
        demo.translate([long])
    sentences, plan = demo.split_documents([long])
    assert len(sentences) > 1 and plan.join(sentences) == [long]
    assert all(len(ids) <= demo.limits.max_positions for ids in demo.encode(sentences))
    assert demo.translate([long], split=True) == plan.join(demo.translate(sentences))
