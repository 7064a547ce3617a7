"""The language of each text among the served ones (twostep/runtime/detect.py), with lingua itself: sentences
detected right, only served tags answered and as the caller spelled them, nothing for a text without letters,
confidences 0-100 best first, Chinese under its served tags, each text of a batch on its own, the same answers
from threads at once, and a pip hint where lingua is missing."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from twostep.errors import BackendUnavailable
from twostep.runtime.detect import open_detector

SERVED = ["en", "fr", "de", "es", "it", "pt"]
SENTENCES = {
    "en": "The train to Manchester was delayed by forty minutes this morning.",
    "fr": "Est-ce que tu peux m'envoyer le document avant vendredi ?",
    "de": "Vergiss bitte nicht, die Tür abzuschließen, wenn du gehst.",
    "es": "Pedimos dos pizzas, una ensalada y una botella de agua.",
    "it": "Credo che la riunione sia andata bene, ma il budget resta un problema.",
    "pt": "Não se esqueça de trancar a porta quando sair.",
}


def same(a: list[list[tuple[str, float]]], b: list[list[tuple[str, float]]]) -> bool:
    """The same candidates in the same order, the confidences to 1e-9 (lingua's last digit varies from call to call)."""
    return [[tag for tag, _ in c] for c in a] == [[tag for tag, _ in c] for c in b] and all(
        x == pytest.approx(y, abs=1e-9) for ca, cb in zip(a, b) for (_, x), (_, y) in zip(ca, cb))


@pytest.fixture(scope="module")
def detector():
    return open_detector()


def test_sentences_are_detected_among_the_served_languages(detector):
    found = detector.detect(list(SENTENCES.values()), SERVED)
    assert [candidates[0][0] for candidates in found] == list(SENTENCES)
    assert all(candidates[0][1] > 50 for candidates in found)


def test_a_text_in_a_language_not_served_gets_served_tags_only(detector):
    (italian,) = detector.detect([SENTENCES["it"]], ["en", "de", "fr"])
    assert italian and {tag for tag, _ in italian} <= {"en", "de", "fr"}
    assert sum(c for _, c in italian) == pytest.approx(100)  # detected among them, not detected and then filtered
    # no served language is written in Cyrillic: no answer rather than a wrong one
    assert detector.detect(["Мы заказали две пиццы, салат и бутылку воды."], SERVED) == [[]]
    # tags come back as the caller spelled them; one lingua does not know is never an answer
    (brazilian,) = detector.detect(["Você pode me mandar o relatório até sexta-feira?"], ["en", "pt-BR", "ky", "xx"])
    assert brazilian[0][0] == "pt-BR" and {tag for tag, _ in brazilian} <= {"en", "pt-BR"}


@pytest.mark.parametrize("text", ["", "   ", "😀🎉👍", "...!? -- ;)", "123 456,78", "\n\t"])
def test_a_text_without_letters_gets_nothing(detector, text):
    assert detector.detect([text], SERVED) == [[]]


def test_confidences_are_0_to_100_best_first(detector):
    texts = list(SENTENCES.values()) + ["Hello", "Merci", "Ciao, come stai?", "OK"]
    for candidates in detector.detect(texts, SERVED):
        confidences = [confidence for _, confidence in candidates]
        assert candidates and all(0 < c <= 100 for c in confidences)
        assert confidences == sorted(confidences, reverse=True)
        assert sum(confidences) == pytest.approx(100)  # over the served languages


def test_chinese_gets_the_chinese_tags_served(detector):
    text = "今天早上去上海的火车晚点了四十分钟。"
    assert detector.detect([text], ["en", "zh-Hans", "ja"])[0] == [("zh-Hans", 100.0)]
    # lingua has one Chinese: both scripts served, both answered at the same confidence, in the order given
    assert detector.detect([text], ["zh-Hant", "en", "zh-Hans"])[0] == [("zh-Hant", 100.0), ("zh-Hans", 100.0)]
    assert detector.detect([SENTENCES["en"]], ["en", "zh-Hans"])[0][0][0] == "en"


def test_each_text_of_a_batch_gets_its_own_language(detector):
    texts = [SENTENCES["de"], SENTENCES["en"], "", SENTENCES["de"], SENTENCES["fr"]]
    found = detector.detect(texts, SERVED)
    assert [candidates[0][0] if candidates else None for candidates in found] == ["de", "en", None, "de", "fr"]
    assert same([found[0]], [found[3]])
    assert detector.detect([], SERVED) == []


def test_threads_at_once_get_the_answers_of_one_thread():
    detector, texts = open_detector(), list(SENTENCES.values())
    sets = [SERVED, SERVED[:3], ["fr", "it"], SERVED]
    expected = [open_detector().detect(texts, languages) for languages in sets]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: detector.detect(texts, sets[i % 4]), range(32)))
    assert all(same(got[i], expected[i % 4]) for i in range(32))


def test_a_missing_lingua_is_a_user_error_with_a_pip_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "lingua", None)  # what `import lingua` meets where it is not installed
    with pytest.raises(BackendUnavailable, match="pip install 'twostep\\[serve\\]'.*lingua-language-detector"):
        open_detector()


@pytest.mark.parametrize("tags", [["en", "no", "da"], ["en", "nb", "da"], ["en", "tl", "id"], ["en", "fil", "id"]])
def test_norwegian_and_tagalog_are_found_under_either_tag(detector, tags):
    """lingua knows Bokmål ("nb") and Tagalog ("tl"): a server's macrolanguage "no" is Bokmål, and "fil" (as
    langcodes spells Tagalog, "tl" too) is Tagalog; either way the text comes back under the tag served."""
    text = {"no": "Jeg glemte nøkkelen hjemme, så jeg måtte vente på naboen i to timer.",
            "tl": "Nakalimutan ko ang susi sa bahay kaya naghintay ako sa kapitbahay nang dalawang oras."}
    (found,) = detector.detect([text["no" if tags[1] in ("no", "nb") else "tl"]], tags)
    assert found[0][0] == tags[1] and found[0][1] > 50, found
