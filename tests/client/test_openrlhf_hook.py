"""The OpenRLHF hook's ``max_worker_kv_tokens`` on a stand-in ``SamplesGenerator`` (no OpenRLHF, no Ray).

OpenRLHF sends each prompt to one vLLM engine (``_dispatch_prompts_to_vllm``: one Ray ref per prompt) and
turns the responses into experiences as the refs complete, in any order
(``_process_response_into_experience``). The hook names each prompt's engine by the actor of its ref and
adds the responses' lengths to that engine. The real generator, with real Ray actors as engines:
tests/frameworks/test_openrlhf.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import eerl
import eerl.integrations.openrlhf as openrlhf_hook
import numpy as np
from eerl import ClientConfig, PhaseKind, Workload
from eerl.integrations._counting import decode_reads
from eerl.testing import FakeDaemon


@dataclass(frozen=True)
class ActorID:
    """Ray's ActorID as the hook reads it: ``binary()``, and ``is_nil()`` for a task of no actor."""

    name: bytes

    def binary(self) -> bytes:
        return self.name

    def is_nil(self) -> bool:
        return self.name == b""


@dataclass
class Ref:
    """A Ray ObjectRef of an actor task: ``task_id().actor_id()``, and (here) the result it stands for."""

    actor: ActorID
    result: list[dict[str, Any]]

    def task_id(self) -> Ref:
        return self

    def actor_id(self) -> ActorID:
        return self.actor


class Engine:
    """A vLLM engine actor handle: ``generate_responses.remote`` answers each prompt with canned lengths."""

    def __init__(self, name: bytes, lengths: dict[str, list[int]]) -> None:
        self.generate_responses = self
        self._actor = ActorID(name)
        self._lengths = lengths

    def remote(self, *, prompt: str, label: str, num_samples: int, **kwargs: Any) -> Ref:
        lengths = self._lengths[prompt]
        assert len(lengths) == num_samples
        return Ref(self._actor, [{"prompt": prompt, "label": label, "length": n} for n in lengths])


@dataclass
class Experience:
    action_mask: Any
    attention_mask: Any
    prompts: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


class Generator:
    """``SamplesGenerator``'s control flow: dispatch ``sent`` (prompt, engine index) pairs, then the responses
    in ``completion`` order (positions in ``sent``), each through ``_process_response_into_experience``;
    the positions in ``drop`` are filtered out after decoding, as dynamic filtering does."""

    def __init__(
        self,
        engines: list[Engine],
        sent: list[tuple[str, int]],
        completion: list[int],
        drop: frozenset[int] = frozenset(),
    ) -> None:
        self.vllm_engines = engines
        self.sent = sent
        self.completion = completion
        self.drop = drop
        self.buffered: list[Experience] = []

    def generate_samples(self, **generate_kwargs: Any) -> tuple[list[Experience], float, int, bool]:
        if self.buffered:  # served from the sample buffer: nothing decoded now
            samples, self.buffered = self.buffered, []
            return samples, 1.0, 0, False
        prompts = [prompt for prompt, _ in self.sent]
        refs = self._dispatch_prompts_to_vllm(prompts, [f"label {p}" for p in prompts], images=None)
        accepted: list[Experience] = []
        for position in self.completion:
            experiences = [self._process_response_into_experience(r) for r in refs[position].result]
            if position not in self.drop:
                accepted.extend(experiences)
        return accepted, 1.0, len(prompts), False

    def generate_eval_samples(self, **generate_kwargs: Any) -> list[Experience]:
        prompts = [prompt for prompt, _ in self.sent]
        refs = self._dispatch_prompts_to_vllm(prompts, prompts, images=None)
        return [self._process_response_into_experience(r) for ref in refs for r in ref.result]

    def _dispatch_prompts_to_vllm(self, prompts: list[str], labels: list[str], **kwargs: Any) -> list[Ref]:
        return [
            self.vllm_engines[engine].generate_responses.remote(
                prompt=prompt, label=label, num_samples=len(LENGTHS[prompt])
            )
            for (prompt, engine), label in zip(self.sent, labels, strict=True)
        ]

    def _process_response_into_experience(self, response: dict[str, Any], **kwargs: Any) -> Experience:
        n = response["length"]
        mask = np.array([[1] * n + [0] * (8 - n)])
        return Experience(action_mask=mask, attention_mask=np.ones((1, 10)), prompts=[response["prompt"]])


LENGTHS = {"p0": [3, 3], "p1": [6, 1], "p2": [2, 2]}
# Engine 0 decodes p0 and p2 (longest 3; 9 + 9 + 4 + 4 = 26), engine 1 p1 (longest 6; 36 + 1 = 37): the
# busiest is engine 1.
SENT = [("p0", 0), ("p1", 1), ("p2", 0)]
BUSIEST = decode_reads([6, 1])


def engines(names: tuple[bytes, ...] = (b"e0", b"e1")) -> list[Engine]:
    return [Engine(name, LENGTHS) for name in names]


class Trainer:
    """The sync PPOTrainer as far as the generation phase goes: ``samples_generator`` and ``ppo_train``."""

    def __init__(self, generator: Generator) -> None:
        self.samples_generator = generator

    def ppo_train(self, global_steps: int) -> dict[str, float]:
        return {}

    def fit(self, steps: int) -> None:
        for step in range(steps):
            self.samples_generator.generate_samples()
            self.ppo_train(step)


def _generations(
    generator: Generator, fake: FakeDaemon, config: ClientConfig, steps: int = 1
) -> list[Workload]:
    trainer = Trainer(generator)
    with eerl.connect(gpus=[0], config=config) as session:
        hook = openrlhf_hook.instrument(trainer, session)
        trainer.fit(steps)
        generator.generate_eval_samples()  # evaluation: outside any phase, never counted
        hook.remove()
        assert session.flush(5)
    return [p.workload for p in fake.phases if not p.begin and p.kind is PhaseKind.GENERATION]


class TestPerEngine:
    def test_each_response_counts_on_the_engine_its_prompt_went_to(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        (generation,) = _generations(Generator(engines(), SENT, completion=[2, 1, 0]), fake, config)
        assert generation.max_worker_kv_tokens == BUSIEST
        assert (generation.tokens, generation.sequences, generation.max_response_tokens) == (17, 6, 6)

    def test_one_engine_is_the_whole_batch(self, fake: FakeDaemon, config: ClientConfig) -> None:
        generator = Generator(engines((b"e0",)), [(p, 0) for p, _ in SENT], completion=[1, 0, 2])
        (generation,) = _generations(generator, fake, config)
        assert generation.max_worker_kv_tokens == decode_reads([3, 3, 6, 1, 2, 2])

    def test_responses_filtered_out_were_still_decoded_and_count(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        generator = Generator(engines(), SENT, completion=[0, 1, 2], drop=frozenset({1}))
        (generation,) = _generations(generator, fake, config)
        assert generation.max_worker_kv_tokens == BUSIEST
        assert generation.sequences == 4  # the tokens are those of the samples kept

    def test_a_batch_served_from_the_sample_buffer_decoded_nothing(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        generator = Generator(engines(), SENT, completion=[0, 1, 2])
        generator.buffered = [Experience(action_mask=np.ones((1, 4)), attention_mask=np.ones((1, 6)))]
        first, second = _generations(generator, fake, config, steps=2)
        assert (first.max_worker_kv_tokens, first.tokens) == (0, 4)
        assert second.max_worker_kv_tokens == BUSIEST

    def test_remove_restores_the_generator(self, config: ClientConfig) -> None:
        generator = Generator(engines(), SENT, completion=[0, 1, 2])
        with eerl.connect(gpus=[0], config=config) as session:
            openrlhf_hook.instrument(Trainer(generator), session).remove()
        wrapped = {"generate_samples", "_dispatch_prompts_to_vllm", "_process_response_into_experience"}
        assert not wrapped & set(vars(generator))


class TestUnknownReportsZero:
    def test_the_same_prompt_on_two_engines_cannot_be_told_apart(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        generator = Generator(engines(), [*SENT, ("p0", 1)], completion=[0, 1, 2, 3])
        (generation,) = _generations(generator, fake, config)
        assert (generation.max_worker_kv_tokens, generation.sequences) == (0, 8)

    def test_the_same_prompt_twice_on_one_engine_is_that_engines(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        generator = Generator(engines(), [*SENT, ("p1", 1)], completion=[3, 0, 1, 2])
        (generation,) = _generations(generator, fake, config)
        assert generation.max_worker_kv_tokens == decode_reads([6, 1, 6, 1])

    def test_a_ref_that_names_no_actor(self, fake: FakeDaemon, config: ClientConfig) -> None:
        generator = Generator(engines((b"e0", b"")), SENT, completion=[0, 1, 2])
        (generation,) = _generations(generator, fake, config)
        assert generation.max_worker_kv_tokens == 0


class TestEngineTally:
    def test_unplaceable_responses_make_it_unknown(self) -> None:
        tally = openrlhf_hook._EngineTally()
        tally.dispatched([("p", "l"), ("q", "l")], [b"a", b"b"])
        tally.decoded(("p", "l"), [3])
        tally.decoded(("q", "l"), [2, 2])
        assert tally.busiest() == decode_reads([3])  # as many KV reads (4) as b, in 3 decode steps to 2
        tally.decoded(("never sent", None), [1])
        assert tally.busiest() == 0

    def test_a_dispatch_it_cannot_pair_up_makes_it_unknown(self) -> None:
        tally = openrlhf_hook._EngineTally()
        tally.dispatched([("p", "l")], [b"a", b"b"])
        assert not tally.known

    def test_unhashable_labels_fall_back_to_the_prompt(self) -> None:
        assert openrlhf_hook._keys(["p"], [["a", "list"]]) == [("p", None)]
        assert openrlhf_hook._response_key({"prompt": "p", "label": ["a", "list"]}) == ("p", None)
        assert openrlhf_hook._response_key("not a response") is None
