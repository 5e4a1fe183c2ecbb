"""vLLM generation backend: HFBackend's interface and semantics on a live vLLM engine.

    backend = VLLMBackend.from_model(model, tokenizer)    # engine built from the policy in memory
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=24), tries)
    ...                                                   # optimizer step on the policy
    backend.update_weights(model)                         # push the new weights in place

Semantics kept from HFBackend (agentrecipe/rollout/hf_backend.py):
- Prompts are token ids (`TokensPrompt`); the sampled ids and their log-probs
  come back as generated, never re-tokenised. Generation stops only at the
  policy's eos (`ignore_eos` + `stop_token_ids=[eos]`), which is kept in `ids`;
  `generation_config="vllm"` so the model's generation_config.json changes nothing.
- Log-probs are those of the distribution actually sampled from:
  `logprobs_mode="processed_logprobs"` returns log softmax after the allowed-token
  mask, temperature and top-p (greedy: log softmax of the raw logits), as HF does.
- Constrained decoding (a TokenTrie per prompt) runs inside the engine: each
  request carries its commands' token ids and `vllm_trie.TrieLogitsProcessor`
  masks every token outside the trie's allowed set to -inf before each decode
  step, so one `LLM.generate` per turn decodes every row, free or constrained,
  to its end. vLLM applies the mask before the softmax, so the log-prob it
  returns is that of p_c(y_t) = p(y_t) / sum_{v in allowed_t} p(v), the
  renormalised distribution of agent/decoding.py, and a node with one child
  gives exactly 0 (as HF computes it). The per-token allowed sets for training
  are rebuilt from the trie after the fact (`vllm_trie.allowed_sets`). Before,
  the backend made one engine call per branching token (`max_tokens=1`,
  `allowed_token_ids` = the node's children). Scoring every admissible command
  with `prompt_logprobs` was rejected: vLLM skips the prefix cache for requests
  that ask for prompt log-probs.
- Prefix caching is on: within an episode each turn's prompt extends the last
  one, so only the new observation is prefilled (`RequestOutput.num_cached_tokens`).
- `update_weights(model)` streams the state dict (gathered under ZeRO-3) into
  the running engine through `collective_rpc(vllm_worker.load_weights)`: no
  restart, no disk round trip; then resets the prefix cache, whose blocks hold
  keys and values computed with the old weights.

The engine starts from the policy's config with `load_format="dummy"` and gets
its weights from the first push, so the weights always come from the model in
memory. Engine knobs come from keyword arguments or AGENTRECIPE_VLLM_* variables
(see `engine_kwargs`). Under a launcher with WORLD_SIZE > 1 every rank runs its
own engine on its own device (`distributed_executor_backend="external_launcher"`)
and plays its own episodes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from agentrecipe import dist
from agentrecipe.agent.decoding import TokenTrie
from agentrecipe.rollout.backend import Generation, SamplingParams, row_temperatures
from agentrecipe.rollout.vllm_trie import TRIE_PROCESSOR, allowed_sets, trie_args

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
SEED_MOD = 2**62


def engine_kwargs(**overrides) -> dict:
    """Defaults for `vllm.LLM(...)`, then AGENTRECIPE_VLLM_* variables, then `overrides`.

    AGENTRECIPE_VLLM_GPU_MEMORY (fraction of GPU memory for weights + KV cache,
    default 0.3: the trainer shares the GPU), AGENTRECIPE_VLLM_EAGER (1 = no
    CUDA graphs / torch.compile, default 1 on CPU). max_model_len follows agent.max_context
    (`from_model`).
    """
    on_cpu = not torch.cuda.is_available()
    kw: dict = {
        "enable_prefix_caching": True,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",
        "skip_tokenizer_init": True,
        "enforce_eager": os.environ.get("AGENTRECIPE_VLLM_EAGER", "1" if on_cpu else "0") == "1",
        "hf_overrides": {"quantization_config": None},  # a GGUF-converted config may still name its quantisation
        "logits_processors": [TRIE_PROCESSOR],  # admissible-command decoding (rollout/vllm_trie.py)
    }
    if not on_cpu:
        kw["gpu_memory_utilization"] = float(os.environ.get("AGENTRECIPE_VLLM_GPU_MEMORY", "0.3"))
    if dist.world_size() > 1:
        kw["distributed_executor_backend"] = "external_launcher"  # one engine per rank, in the rank's process
        kw["seed"] = dist.rank()
    kw.update(overrides)
    return kw


def _set_engine_env() -> None:
    """Environment vLLM needs here; values the user set win."""
    # The weight push sends a function and tensors to the engine process.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default share of a NUMA node fails here


def state_dict_for_push(model) -> dict[str, torch.Tensor]:
    """The policy's full state dict, on its own device (a DeepSpeed engine or a module).

    Under ZeRO-3 the parameters are partitioned: they are gathered, which is a
    collective, so every rank must call this (and so `update_weights`) together.
    """
    module = getattr(model, "module", model)
    params = list(module.parameters())
    if any(hasattr(p, "ds_id") for p in params):  # ZeRO-3 partitioned
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
    return {k: v.detach() for k, v in module.state_dict().items()}


class VLLMBackend:
    """Batched generation on a vLLM engine, with HFBackend's semantics (see the module docstring)."""

    exact_logprobs = False
    """vLLM's kernels are not the trainer's: RL recomputes pi_old's log-probs."""

    def __init__(self, model_dir: str | Path, eos_id: int, dtype: torch.dtype = torch.float32, **engine_overrides):
        _set_engine_env()
        from vllm import LLM

        self.eos_id = eos_id
        self.model_dir = str(model_dir)
        self.llm = LLM(model=self.model_dir, dtype=DTYPE_NAMES[dtype], **engine_kwargs(**engine_overrides))
        # In-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, external_launcher): the worker gets tensors as is.
        self._in_process = hasattr(self.llm.llm_engine, "model_executor")
        self.stats = {"engine_calls": 0, "prompt_tokens": 0, "cached_tokens": 0, "generated_tokens": 0}

    @classmethod
    def from_model(cls, model, tokenizer, max_context: int | None = None, **engine_overrides) -> VLLMBackend:
        """An engine for the policy in memory: its config only on disk (dummy weights), then a weight push.

        `max_context` (agent.max_context) becomes the engine's max_model_len, checked against the
        model's positions here, before the engine starts: a longer prompt is refused by vLLM mid-run."""
        module = getattr(model, "module", model)
        if max_context is not None:
            positions = getattr(module.config, "max_position_embeddings", None)
            if positions is not None and max_context > positions:
                raise ValueError(f"agent.max_context {max_context} exceeds the model's max_position_embeddings "
                                 f"{positions}: vLLM refuses longer prompts; lower agent.max_context")
            engine_overrides.setdefault("max_model_len", max_context)
        config_dir = Path(tempfile.mkdtemp(prefix="agentrecipe-vllm-"))
        module.config.save_pretrained(config_dir)
        _drop_quantization_config(config_dir / "config.json")
        dtype = next(module.parameters()).dtype
        backend = cls(config_dir, tokenizer.eos_token_id, dtype, load_format="dummy", **engine_overrides)
        backend.update_weights(model)
        return backend

    # ------------------------------------------------------------------ weights
    def update_weights(self, model) -> None:
        """Push the policy's current weights into the live engine (every rank calls it: ZeRO-3 gathers)."""
        from agentrecipe.rollout import vllm_worker

        state = state_dict_for_push(model)
        if not self._in_process:  # through vLLM's RPC as one safetensors blob (see vllm_worker.load_weights)
            from safetensors.torch import save as save_safetensors

            state = save_safetensors(_untie({k: v.cpu() for k, v in state.items()}))
        self.llm.collective_rpc(vllm_worker.load_weights, args=(state,))
        self.llm.reset_prefix_cache()  # cached blocks hold keys/values of the old weights

    # --------------------------------------------------------------- generation
    def release(self, keys=None) -> None:
        """Nothing kept per key: the prefix cache finds shared prefixes by itself."""

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, tries: list[TokenTrie | None] | None = None,
        keys: list | None = None,
    ) -> list[Generation]:
        """One engine call for the whole batch, free and constrained rows alike (`keys` are ignored:
        prefix caching reuses each episode's earlier turns without them)."""
        if not prompts:
            return []
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        tries = tries or [None] * len(prompts)
        temperatures = row_temperatures(params, len(prompts))
        sps = []
        for i, trie in enumerate(tries):
            greedy = temperatures[i] == 0
            seed = None if params.seed is None else (params.seed * 1_000_003 + i * 10_007) % SEED_MOD
            sps.append(VSamplingParams(
                n=1, temperature=temperatures[i], top_p=1.0 if greedy else params.top_p,
                max_tokens=params.max_new_tokens, seed=seed, logprobs=0, ignore_eos=True, stop_token_ids=[self.eos_id],
                detokenize=False, skip_special_tokens=False,
                extra_args=None if trie is None else trie_args(trie, self.eos_id),
            ))
        results = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sps, use_tqdm=False)
        self.stats["engine_calls"] += 1
        out = []
        for req, trie in zip(results, tries):
            comp = req.outputs[0]
            ids = list(comp.token_ids)
            self.stats["prompt_tokens"] += len(req.prompt_token_ids)
            self.stats["cached_tokens"] += req.num_cached_tokens or 0
            self.stats["generated_tokens"] += len(ids)
            out.append(Generation(
                ids=ids, logprobs=[float(d[t].logprob) for t, d in zip(ids, comp.logprobs)],
                allowed=None if trie is None else allowed_sets(trie, ids),
                finished=bool(ids) and ids[-1] == self.eos_id,
            ))
        return out

    def close(self) -> None:
        """Shut the engine down (its processes would otherwise outlive a killed parent)."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if shutdown is not None:
                shutdown()
            self.llm = None


def _untie(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, each its own storage (safetensors refuses shared ones, e.g. a tied lm_head)."""
    seen: set[int] = set()
    out = {}
    for k, v in state.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.contiguous().clone() if ptr in seen else v.contiguous()
        seen.add(ptr)
    return out


def _drop_quantization_config(path: Path) -> None:
    cfg = json.loads(path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(cfg, indent=2))
