"""The critic's input for a state: problem + reference solution (if any) + partial answer.

``score_chunks`` and ``update_critic`` build inputs through this one class, so the critic
is trained on exactly the layout it is scored with.
"""

from __future__ import annotations

from ac2_core.config import AC2Config
from ac2_core.models.critic import build_critic_input
from ac2_core.stages.common import Problems, prompt_ids


class CriticInputs:
    def __init__(self, cfg: AC2Config, tokenizer, problems: Problems, replay: list[dict]):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.problems = problems
        self.references = {t["trajectory_id"]: t["token_ids"] for t in replay}
        self.ref_id = tokenizer.convert_tokens_to_ids("<|ref|>")
        self.state_id = tokenizer.convert_tokens_to_ids("<|state|>")
        self._prompts: dict[str, list[int]] = {}

    def build(self, problem_id: str, ref_trajectory_id: str | None, state: list[int]) -> list[int]:
        if problem_id not in self._prompts:
            self._prompts[problem_id] = prompt_ids(self.tokenizer, self.problems[problem_id]["prompt"])
        ref = None
        if ref_trajectory_id is not None and self.cfg.critic.use_reference:
            try:
                ref = self.references[ref_trajectory_id]
            except KeyError:
                raise ValueError(f"reference trajectory {ref_trajectory_id} is not in the replay table") from None
        return build_critic_input(
            self._prompts[problem_id],
            ref,
            list(state),
            ref_id=self.ref_id,
            state_id=self.state_id,
            max_tokens=self.cfg.critic.max_input_tokens,
        )

    def build_along(self, problem_id: str, ref_trajectory_id: str | None, response: list[int]) -> tuple[list[int], int] | None:
        """The input for the whole ``response`` and the index of its ``<|state|>`` token, so
        position ``head + c`` ends the state ``response[:c]``; None when the input had to be
        cut (then no single pass holds every state as it would be scored alone)."""
        x = self.build(problem_id, ref_trajectory_id, response)
        head = len(x) - len(response) - 1
        return (x, head) if head >= 0 and x[head] == self.state_id and x[head + 1 :] == list(response) else None
