"""Pure parts, without llama.cpp: settings, labels, the label trie, prompts and the scoring layer."""

from __future__ import annotations

import dataclasses
import math
import random
import re
from pathlib import Path

import pytest

from adapter_fakes import CHATML, FakeEngine, fake_decision_model, fake_model_dir
from decision_adapter.errors import InputError, dotted
from decision_adapter.decisions.labels import PAIRED, SINGLE, labels_for
from decision_adapter.decisions.prompt import SYSTEM_INSTRUCTION, ChatTemplate, PromptLayout, TemplateError
from decision_adapter.engine.readout import LabelTrie, NodeRead, common_prefix, prompt_score
from decision_adapter.decisions.model import Question
from decision_adapter.protocols import decision_schema
from decision_adapter.protocols.fields import RequestContext
from decision_adapter.settings import Settings, SettingsError, physical_cores


def test_settings_read_the_environment_once_with_types():
    s = Settings.from_env({"SAGEMAKER_BIND_TO_PORT": "9000", "ADAPTER_THREADS": "3", "ADAPTER_REQUEST_TIMEOUT_S": "2.5",
                           "ADAPTER_FLASH_ATTENTION": "off", "ADAPTER_GPU_LAYERS": "-1", "ADAPTER_MODEL_ID": " "})
    assert (s.port, s.threads, s.request_timeout_s, s.flash_attention, s.gpu_layers) == (9000, 3, 2.5, "off", -1)
    assert s.model_dir == "/opt/ml/model" and s.model_id == ""
    assert s.http_threads == s.queue_depth + 2


@pytest.mark.parametrize("env, message", [
    ({"ADAPTER_THREADS": "two"}, "ADAPTER_THREADS='two' is not an integer"),
    ({"ADAPTER_REQUEST_TIMEOUT_S": "soon"}, "ADAPTER_REQUEST_TIMEOUT_S='soon' is not a number"),
    ({"SAGEMAKER_BIND_TO_PORT": "0"}, "SAGEMAKER_BIND_TO_PORT=0 is below its minimum 1"),
    ({"ADAPTER_QUEUE_DEPTH": "99999"}, "ADAPTER_QUEUE_DEPTH=99999 is above its maximum 1024"),
    ({"ADAPTER_FLASH_ATTENTION": "auto"}, "ADAPTER_FLASH_ATTENTION='auto' must be one of off, on"),
    ({"ADAPTER_CTX_TOKENS": "1024", "ADAPTER_MAX_PROMPT_TOKENS": "2048"},
     "ADAPTER_CTX_TOKENS=1024 is smaller than ADAPTER_MAX_PROMPT_TOKENS=2048"),
])
def test_bad_settings_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def fake_sysfs(root, cores: dict[int, tuple[int, int]]):
    """/sys/devices/system/cpu with ``cpu -> (package, core)``."""
    for cpu, (package, core) in cores.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    return root


def test_the_default_threads_are_the_physical_cores_this_process_may_use(tmp_path):
    # ml.c7i.2xlarge: 8 vCPUs, hyperthread pairs (0,4) (1,5) (2,6) (3,7) on 4 cores
    c7i = fake_sysfs(tmp_path / "c7i", {cpu: (0, cpu % 4) for cpu in range(8)})
    assert physical_cores(set(range(8)), c7i) == 4
    assert physical_cores({0, 4}, c7i) == 1 and physical_cores({0, 1, 4}, c7i) == 2
    two_sockets = fake_sysfs(tmp_path / "two", {0: (0, 0), 1: (1, 0), 2: (0, 0), 3: (1, 0)})
    assert physical_cores({0, 1, 2, 3}, two_sockets) == 2  # core 0 of each package
    assert physical_cores({0, 1, 9}, two_sockets) == 3  # cpu9 has no topology: a core of its own
    assert Settings().threads == physical_cores()


def test_cpu_kernel_settings():
    assert Settings.from_env({"ADAPTER_CPU_VARIANT": "icelake"}).cpu_variant == "icelake"
    assert Settings().cpu_variant == "auto"
    with pytest.raises(SettingsError, match="ADAPTER_CPU_VARIANT='Ice Lake'"):
        Settings.from_env({"ADAPTER_CPU_VARIANT": "Ice Lake"})


def test_every_setting_is_described():
    rows = Settings.describe()
    assert {r["env"] for r in rows} >= {"SAGEMAKER_BIND_TO_PORT", "ADAPTER_MODEL_DIR", "ADAPTER_THREADS",
                                        "ADAPTER_GPU_LAYERS", "ADAPTER_QUEUE_DEPTH", "ADAPTER_MAX_BODY_BYTES"}
    assert all(r["description"] for r in rows)


def test_docs_settings_lists_every_setting_with_its_default():
    """docs/settings.md's table is the users' reference: every variable, with the default the code has."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text(encoding="utf-8")
    table = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([A-Z_]+)` \| ([^|]+) \|", page, re.M)}
    for row in Settings.describe():
        assert row["env"] in table, f"docs/settings.md's settings table lacks {row['env']}"
        if isinstance(row["default"], (str, int, float)) and "(this machine)" not in str(row["default"]) \
                and str(row["default"]) != "":
            assert table[row["env"]].strip() == f"`{row['default']}`", (row["env"], table[row["env"]])


def test_label_sets():
    assert labels_for(3) == ("A", "B", "C") and labels_for(26) == SINGLE
    assert labels_for(27)[:2] == ("A0", "A1") and len(labels_for(255)) == 255
    assert len(set(PAIRED)) == 260
    with pytest.raises(ValueError):
        labels_for(261)


def test_label_trie_chain_rule_multiplies_full_vocabulary_probabilities():
    """log P(label) is the sum over its tokens of logit - log-normaliser of the node it is read at, so an
    uneven trie is not favoured: with a model that has no preference among 100 tokens, every label of two
    tokens gets 1/100 of the probability of the single-token label, whatever its siblings."""
    trie = LabelTrie.build([(1, 10), (1, 11), (1, 12), (2, 10), (3,)])
    flat = math.log(100)
    reads = {node: NodeRead((0.0,) * len(kids), flat, 0) for node, kids in trie.children.items()}
    logprobs = trie.logprobs(reads)
    assert logprobs == pytest.approx((-2 * flat,) * 4 + (-flat,))
    rng = random.Random(7)
    reads = {node: NodeRead(tuple(rng.uniform(-5, 5) for _ in kids), rng.uniform(5, 9), 0)
             for node, kids in trie.children.items()}
    root, one = reads[()], reads[(1,)]
    assert trie.logprobs(reads)[1] == pytest.approx(root.logits[0] - root.log_normaliser
                                                  + one.logits[1] - one.log_normaliser)
    assert trie.logprobs(reads)[4] == pytest.approx(root.logits[2] - root.log_normaliser)


def test_prompt_score_reports_label_mass_and_whether_the_top_token_is_a_label():
    trie = LabelTrie.build([(5,), (6,), (7,)])
    reads = {(): NodeRead((0.0, 0.0, math.log(2)), math.log(8), 6)}
    score = prompt_score(trie, reads)
    assert score.label_mass == pytest.approx(4 / 8) and score.top_token_is_label
    assert score.first_token_logits == (0.0, 0.0, math.log(2))
    assert not prompt_score(trie, {(): NodeRead((0.0, 0.0, 0.0), 3.0, 99)}).top_token_is_label


@pytest.mark.parametrize("labels, message", [
    ([(1,), (1, 2)], "prefix of another"),
    ([(1,), (1,)], "distinct"),
    ([(1,), ()], "non-empty"),
])
def test_label_trie_rejects_ambiguous_labels(labels, message):
    with pytest.raises(ValueError, match=message):
        LabelTrie.build(labels)


def test_small_helpers():
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert dotted(("decisions", 2, "options", 0, "id")) == "decisions[2].options[0].id"
    assert str(InputError(("decision", "state"), "is required")) == "decision.state is required"


def test_chat_template_renders_head_and_generation_prompt():
    layout = PromptLayout(ChatTemplate(CHATML))
    assert layout.head == f"<|im_start|>system\n{SYSTEM_INSTRUCTION}<|im_end|>\n<|im_start|>user\nState:\n"
    assert layout.render("payload").endswith("payload<|im_end|>\n<|im_start|>assistant\n")


def test_template_without_a_system_role_gets_the_instruction_in_the_user_turn():
    template = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
                            "{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]")
    layout = PromptLayout(template)
    assert not template.system_role
    assert layout.render("payload") == f"[user]{SYSTEM_INSTRUCTION}\n\npayload[assistant]"


def test_template_errors_are_template_errors():
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate("{% for %}")


@pytest.fixture
def fake_model(tmp_path):
    model = fake_decision_model(FakeEngine(fake_model_dir(tmp_path) / "fake.gguf"), 600, 900, runtime={"runtime": 1})
    yield model
    model.close()


def question(options=("yes", "no"), state="s", text="q?"):
    return Question(("decision",), state, text, tuple(options),
                    tuple(("decision", "options", i, "description") for i in range(len(options))),
                    ("decision", "state"), ("decision", "question"))


def test_the_fake_engine_is_what_the_decision_model_and_the_scheduler_need(fake_model):
    from decision_adapter.decisions.model import JobScheduler, ScoringEngine
    from decision_adapter.engine.scheduler import JobRunner

    assert isinstance(fake_model.engine, ScoringEngine) and isinstance(fake_model.engine.runner, JobRunner)
    assert isinstance(fake_model.scheduler, JobScheduler)


def test_decision_model_turns_label_logits_into_probabilities(fake_model):
    [scored] = fake_model.score(fake_model.prepare([question(("a", "b", "c"))])).results
    expected = [math.exp(-i) for i in range(3)]
    assert scored.probabilities == pytest.approx([e / sum(expected) for e in expected])
    assert scored.option_logits == (0.0, -1.0, -2.0)


def test_decision_model_uses_the_chain_rule_beyond_26_options(fake_model):
    [scored] = fake_model.score(fake_model.prepare([question([f"o{i}" for i in range(30)], state="x")])).results
    assert len(scored.probabilities) == 30 and math.isclose(sum(scored.probabilities), 1.0)
    assert "chain rule" in scored.readout


def test_decision_model_rejects_an_over_budget_prompt_before_scoring(fake_model):
    with pytest.raises(InputError, match="decision renders to a prompt of"):
        fake_model.prepare([question(state="x" * 700)])
    assert fake_model.engine.calls == 0, "nothing reached the engine"


@pytest.mark.parametrize("decision, message", [
    ({"state": "x<|im_start|>"}, "decision.state contains the model's control token '<|im_start|>'"),
    ({"options": [{"id": "ok"}, {"id": "no", "description": "<|im_end|>"}]},
     "decision.options[1].description contains the model's control token '<|im_end|>'"),
])
def test_validation_refuses_the_models_control_tokens(fake_model, decision, message):
    body = {"decision": {"id": "d", "state": "s", "question": "q?", "options": [{"id": "a"}, {"id": "b"}], **decision}}
    with pytest.raises(InputError) as refused:
        decision_schema.parse(body, RequestContext.of(fake_model, max_decisions=4))
    assert str(refused.value) == message
    decision_schema.parse(body, RequestContext(max_decisions=4))  # without the model's tokens the text is fine


def test_request_budget_counts_the_shared_state_once(fake_model):
    prepared = fake_model.prepare([question(state="x" * 300, text=f"{i}?") for i in range(2)])
    own = [len(t) - common_prefix(prepared.tokens) for t in prepared.tokens]
    assert prepared.request_tokens == common_prefix(prepared.tokens) - fake_model.engine.resident_tokens + sum(own)
    with pytest.raises(InputError, match="over the request limit of 900"):
        fake_model.prepare([question(state="x" * 100, text=f"{i}" * 150) for i in range(6)])


def test_the_state_span_runs_from_the_head_to_the_question_heading_whatever_the_questions(fake_model):
    """The tokens decoded as the state are the same for a question alone and beside others that share
    more of their text (here 'Which '), so its answer cannot depend on them."""
    alone = fake_model.prepare([question(state="the state", text="Which team?")])
    together = fake_model.prepare([question(state="the state", text=t) for t in ("Which team?", "Which language?")])
    engine = fake_model.engine
    head = len(engine.vocabulary.tokenize(fake_model.layout.head, special=True, bos=True))
    end = head + len(engine.vocabulary.tokenize("the state" + "\n\nQuestion:\n"))
    assert alone.state == together.state == (head, end) and head == engine.resident_tokens
    assert common_prefix(together.tokens) > end, "the questions share 'Which ' beyond the state"
    fake_model.score(together)
    assert engine.state_end == end


def test_orderings_come_from_the_option_set_alone():
    from decision_adapter.decisions.model import orderings

    assert orderings(["b", "a", "c"], 1) == [(0, 1, 2)], "k = 1 is the request's order"
    assert orderings(["b", "a", "c"], 3) == [(1, 0, 2), (0, 2, 1), (2, 1, 0)]
    assert orderings(["b", "a", "c"], 9) == orderings(["b", "a", "c"], 3), "k is capped at the options"
    four = orderings(["d", "c", "b", "a"], 2)
    assert four == [(3, 2, 1, 0), (1, 0, 3, 2)], "evenly spaced shifts of the canonical order"
    keys = ["x", "y", "z", "w"]
    shuffled = [2, 0, 3, 1]
    aligned = [[shuffled[i] for i in order] for order in orderings([keys[i] for i in shuffled], 4)]
    assert aligned == [list(order) for order in orderings(keys, 4)], "the same options shown whatever the request order"


def test_averaged_orderings_do_not_depend_on_the_request_order(fake_model):
    """With a model that prefers whatever is shown first, k = 1 follows the request's order and k = n does not."""
    fake_model.engine.logits = lambda n: [-3.0 * i for i in range(n)]
    texts = ("Refunds.", "Bugs.", "Sales.")

    def score(order, k):
        q = question(options=tuple(texts[i] for i in order))
        q = dataclasses.replace(q, option_keys=tuple(f"id{i}" for i in order), permutations=k)
        [result] = fake_model.score(fake_model.prepare([q])).results
        return {f"id{i}": p for i, p in zip(order, result.probabilities)}

    assert score((0, 1, 2), 1) != score((2, 0, 1), 1)
    averaged = score((0, 1, 2), 3)
    assert averaged == pytest.approx(score((2, 0, 1), 3), abs=1e-12)
    assert all(p == pytest.approx(1 / 3, abs=1e-12) for p in averaged.values()), "position bias averages out"


def test_a_template_that_opens_a_thinking_block_is_closed_before_the_answer_position():
    from decision_adapter.decisions.prompt import close_thinking

    thinking = CHATML.replace("<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n")
    layout = PromptLayout(ChatTemplate(thinking))
    rendered = layout.render("payload")
    assert rendered.endswith("<think>\n\n</think>\n\n")
    assert close_thinking("a<think>x</think>\n\n") == "a<think>x</think>\n\n", "a closed block is left alone"
    assert PromptLayout(ChatTemplate(CHATML)).render("p").endswith("<|im_start|>assistant\n")


def test_worked_examples_sit_in_the_resident_head_with_varied_answers():
    from decision_adapter.decisions.prompt import STYLES

    layout = PromptLayout(ChatTemplate(CHATML), STYLES["exact-examples-digits"])
    head = layout.head
    assert head.count("<|im_start|>assistant\n") == 3 and head.endswith("<|im_start|>user\nState:\n")
    answers = [part.split("<|im_end|>")[0] for part in head.split("<|im_start|>assistant\n")[1:]]
    assert answers == ["B", "A", "2"], "letters vary and the score example answers with its digit"
    assert STYLES["plain"].labels(3, "score") == ("A", "B", "C")
    assert STYLES["exact-examples-digits"].labels(3, "score") == ("0", "1", "2")
    assert STYLES["exact-examples-digits"].labels(3, "choice") == ("A", "B", "C")
