"""The word-list family the warm-up and the demo share: every word one token, tasks fixed by
their seed, and a reward whose shaping part never reaches an exact solve."""

from envs import wordops


def test_every_word_and_name_is_one_token_of_the_tiny_tokenizer(tiny_model_dir):
    # the operations are token permutations only if each word is a single token
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    names = [n for ns in wordops.KNOWN_NAMES.values() for n in ns]
    for word in [*wordops.WORDS, *names, *wordops.UNSEEN_NAMES, *wordops.THROWAWAY_NAMES]:
        assert len(tok(" " + word, add_special_tokens=False)["input_ids"]) == 1, word


def test_the_names_rl_must_learn_are_never_taught_by_the_warm_up():
    taught = {n for ns in wordops.KNOWN_NAMES.values() for n in ns} | set(wordops.THROWAWAY_NAMES)
    assert not taught & set(wordops.UNSEEN_NAMES)
    assert not taught & set(wordops.WORDS)


def test_tasks_are_distinct_and_the_same_for_the_same_seed():
    a, b = wordops.tasks("tail", "last", 100, seed=3), wordops.tasks("tail", "last", 100, seed=3)
    assert a == b and len({t.words for t in a}) == 100
    assert a != wordops.tasks("tail", "last", 100, seed=4)
    assert a[0].prompt == f"Apply tail to: {' '.join(a[0].words)}" and a[0].answer == a[0].words[-1]


def test_only_the_exact_answer_scores_one_and_the_shaping_part_stays_below_it():
    task = wordops.WordTask("t", "back", ("next", "pop", "dict"), "reverse")
    assert wordops.exact(task, " dict pop next") == 1.0
    assert wordops.exact(task, "dict pop next extra") == 0.0
    assert wordops.overlap(task, "dict pop") == 2 / 3
    assert wordops.overlap(task, "dict pop next extra") == 2 / 3  # an extra word costs one
    assert wordops.overlap(task, None) == 0.0
