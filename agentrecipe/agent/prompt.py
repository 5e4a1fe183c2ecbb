"""The one chat format every model uses, built on the tokenizer's own chat template.

An episode is: system prompt, then a user message with the objective and the
first observation, then alternating assistant actions and user observations.
We never hard-code model-specific separators: `ChatFormat` renders two probe
conversations through the tokenizer's chat template once and cuts out the
text that surrounds a user message and follows an assistant turn.

Token layout of a prompt (what the policy conditions on at turn t):

    head(obs_s) | action_s <eos> | segment(obs_s+1) | ... | action_t-1 <eos> | segment(obs_t)

where s = max(0, t - history) (history = -1 keeps all turns, so s = 0 and
the sequence only ever grows). `head` is system + first user message +
generation prompt; `segment` is what follows an assistant's <eos>: the rest
of the template after the eos, the user message, then the generation prompt.
Action token ids are kept as sampled; only new observations are tokenised. A
free reply cut by agent.max_action_tokens has no <eos> of its own: the later
prompts close it with one (outside the action mask), so every assistant turn
ends as in the demonstrations (before, the reply ran into the next user message).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from agentrecipe.envs.base import Observation

SYSTEM_PROMPT = (
    "You are an agent playing a text-based game. Each turn you read what happened "
    "and reply with exactly one command, such as 'go north' or 'take key'. "
    "Reach the goal in as few turns as you can."
)
INVALID_REPLY = "Invalid reply: answer with exactly one game command."

_A, _U = "\x00A\x00", "\x00U\x00"  # probe contents that no template contains


def user_text(obs: Observation, show_admissible: bool, with_goal: bool) -> str:
    """The user message for one observation."""
    parts = []
    text = obs.text.strip()
    if with_goal and obs.objective:
        objective = obs.objective.strip()
        parts.append(f"Goal: {objective}")
        if objective in text:  # drop the line(s) stating it: TextWorld's intro, ALFWorld's "Your task is to: ..."
            marked = text.replace(objective, "\x00")
            text = "\n".join(line for line in marked.split("\n") if "\x00" not in line).strip()
    parts.append(text or "(nothing happens)")
    if show_admissible and obs.admissible_commands:
        parts.append("Admissible commands: " + ", ".join(obs.admissible_commands))
    return "\n\n".join(parts)


@dataclass(frozen=True)
class ChatFormat:
    """The text pieces of a tokenizer's chat template around one turn."""

    head_pre: str
    """Text before the first user message's content (system message included)."""
    user_post: str
    """Text after a user message's content, through the assistant generation prompt."""
    between: str
    """Template text after an assistant's eos token, up to the next user message's content."""
    eos_token: str

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, system_prompt: str = SYSTEM_PROMPT) -> "ChatFormat":
        """Cut the pieces out of two probe conversations rendered by the chat template."""
        if tokenizer.chat_template is None:
            raise ValueError("tokenizer has no chat template")
        eos = tokenizer.eos_token
        system = {"role": "system", "content": system_prompt}
        one = tokenizer.apply_chat_template(
            [system, {"role": "user", "content": _U}], tokenize=False, add_generation_prompt=True
        )
        head_pre, user_post = one.split(_U)
        two = tokenizer.apply_chat_template(
            [system, {"role": "user", "content": "x"}, {"role": "assistant", "content": _A}, {"role": "user", "content": _U}],
            tokenize=False,
            add_generation_prompt=True,
        )
        between = two.split(_A)[1].split(_U)[0]  # eos + template text + next user's prefix
        if not between.startswith(eos):
            raise ValueError(f"chat template does not end an assistant turn with the eos token {eos!r}")
        return cls(head_pre=head_pre, user_post=user_post, between=between[len(eos):], eos_token=eos)

    def head(self, first_user: str) -> str:
        return self.head_pre + first_user + self.user_post

    def segment(self, user: str) -> str:
        """Text appended after an assistant's eos: the next user message and generation prompt."""
        return self.between + user + self.user_post


class PromptEncoder:
    """Tokenises prompts and actions for one tokenizer, caching observation segments."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, show_admissible: bool = True, history: int = -1):
        self.tokenizer = tokenizer
        self.fmt = ChatFormat.from_tokenizer(tokenizer)
        self.show_admissible = show_admissible
        self.history = history
        self.eos_id = tokenizer.eos_token_id

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_action(self, action: str) -> list[int]:
        """Token ids of an action reply, eos included (what SFT teaches the policy to emit)."""
        return self.encode_text(action) + [self.eos_id]

    def head_ids(self, obs: Observation) -> list[int]:
        return self.encode_text(self.fmt.head(user_text(obs, self.show_admissible, with_goal=True)))

    def segment_ids(self, obs: Observation) -> list[int]:
        return self.encode_text(self.fmt.segment(user_text(obs, self.show_admissible, with_goal=False)))

    def window_start(self, turn: int) -> int:
        return 0 if self.history < 0 else max(0, turn - self.history)

    def prompt(
        self, observations: list[Observation], actions: list[list[int]], cache: dict | None = None
    ) -> tuple[list[int], list[int], list[int]]:
        """Prompt for the turn after `len(actions)` actions.

        Returns (input_ids, action_mask, turn_ids): mask 1 on past action tokens
        (for training on a whole transcript), turn id of each such token, -1 elsewhere.
        `observations` has one more element than `actions`. Pass the same `cache`
        dict for one episode and each observation is tokenised once.
        """
        t = len(actions)
        assert len(observations) == t + 1, "need one observation per turn plus the current one"
        cache = {} if cache is None else cache
        s = self.window_start(t)
        if ("head", s) not in cache:
            cache[("head", s)] = self.head_ids(observations[s])
        ids = list(cache[("head", s)])
        mask = [0] * len(ids)
        turns = [-1] * len(ids)
        for i in range(s, t):
            ids += actions[i]
            mask += [1] * len(actions[i])
            turns += [i] * len(actions[i])
            if not actions[i] or actions[i][-1] != self.eos_id:  # a reply cut by the token limit
                ids.append(self.eos_id)
                mask.append(0)
                turns.append(-1)
            if ("seg", i + 1) not in cache:
                cache[("seg", i + 1)] = self.segment_ids(observations[i + 1])
            seg = cache[("seg", i + 1)]
            ids += seg
            mask += [0] * len(seg)
            turns += [-1] * len(seg)
        return ids, mask, turns


def fits_context(prompt_len: int, max_action_tokens: int, longest_command: int | None, max_context: int) -> bool:
    """Whether a turn is played: its prompt plus room for the reply fit agent.max_context (the
    reply room is max_action_tokens, or the longest admissible command's tokens when decoding is
    constrained to them and that is longer). Otherwise the episode ends there (context_cut)."""
    return prompt_len + max(max_action_tokens, longest_command or 0) <= max_context


def parse_reply(text: str, max_chars: int = 100) -> str | None:
    """One action from a model reply, or None for a malformed reply (empty or not a command)."""
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    line = line.strip(" .!\"'`>").strip()
    if not line or len(line) > max_chars or not any(c.isalpha() for c in line):
        return None
    return " ".join(line.split())


def training_sequences(
    encoder: PromptEncoder, observations: list[Observation], actions: list[list[int]], cache: dict | None = None,
    context_turns: bool = False,
) -> list[tuple[list[int], list[int], list[int]]]:
    """The token sequences a finished episode trains on: (input_ids, action_mask, turn_ids).

    history = -1: one sequence holding every turn (mask 1 on every action).
    history = k:  one sequence per turn t, its prompt as the policy saw it and
                  mask 1 only on turn t's action (earlier actions are context).
    turn_ids are -1 on context tokens, or with `context_turns` the turn of every action token
    in the sequence (context actions included; the mask is unchanged).
    """
    if not actions:
        return []
    if encoder.history < 0:
        ids, mask, turns = encoder.prompt(observations[: len(actions)], actions[:-1], cache)
        last = len(actions) - 1
        return [(ids + actions[-1], mask + [1] * len(actions[-1]), turns + [last] * len(actions[-1]))]
    out = []
    for t, action in enumerate(actions):
        ids, _, turns = encoder.prompt(observations[: t + 1], actions[:t], cache)
        context = turns if context_turns else [-1] * len(ids)
        out.append((ids + action, [0] * len(ids) + [1] * len(action), context + [t] * len(action)))
    return out
