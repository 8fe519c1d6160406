"""``met generate``: stream one completion to the terminal.

Owner: the CLI.  Runs the real engine (paged KV, chunked prefill, the sampler plugin) on one
request and writes text deltas to stdout as they are produced.

Invariants:
- Only generated text goes to stdout (plus a final newline); progress and logs go to stderr.
- Bad input (empty prompt, prompt too long, bad sampling values) is a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import sys

from metrale_core.cli.flags import add_engine_flags, engine_config_from_args, load_engine_model
from metrale_core.errors import InvalidRequest

__all__ = ["add_parser", "run"]


def add_parser(sub, registry) -> argparse.ArgumentParser:
    cmd = sub.add_parser(
        "generate",
        help="generate a completion for one prompt",
        description="Generate a completion for PROMPT and stream it to stdout.",
    )
    cmd.add_argument("prompt", help="the prompt text ('-' reads it from stdin)")
    cmd.add_argument(
        "--chat", action="store_true", help="treat PROMPT as a user message and apply the model's chat template"
    )
    cmd.add_argument("--system", default=None, help="system message (with --chat)")
    sampling = cmd.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default: 128)")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=0)
    sampling.add_argument("--min-p", type=float, default=0.0)
    sampling.add_argument("--repetition-penalty", type=float, default=1.0)
    sampling.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    sampling.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    sampling.add_argument("--ignore-eos", action="store_true", help="keep generating past EOS")
    add_engine_flags(cmd, registry)
    cmd.set_defaults(func=run)
    return cmd


def _sampling_params(args):
    from metrale_core.sampling.params import SamplingParams

    try:
        return SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            seed=args.seed,
            max_tokens=args.max_tokens,
            stop=tuple(args.stop),
            ignore_eos=args.ignore_eos,
        )
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"bad sampling parameter: {exc}") from None


def _prompt_text(args) -> str:
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not text:
        raise InvalidRequest("the prompt is empty")
    return text


def _prompt_ids(args, text: str, tokenizer) -> list[int]:
    if args.chat:
        messages = [{"role": "user", "content": text}]
        if args.system:
            messages.insert(0, {"role": "system", "content": args.system})
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return tokenizer.encode(rendered, add_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=True)


def run(args, registry) -> int:
    params = _sampling_params(args)
    text = _prompt_text(args)
    loaded = load_engine_model(args, registry, args.model)
    driver = getattr(loaded.model, "driver", None)  # a tensor-parallel job to stop at the end
    try:
        return _generate(args, registry, loaded, params, text)
    finally:
        if driver is not None:
            driver.close()


def _generate(args, registry, loaded, params, text) -> int:
    from metrale_core.engine import LLMEngine

    prompt_ids = _prompt_ids(args, text, loaded.tokenizer)
    engine = LLMEngine(loaded.model, engine_config_from_args(args), tokenizer=loaded.tokenizer, registry=registry)
    engine.add_request("generate-0", prompt_ids, params)
    out = sys.stdout
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.text_delta:
                out.write(delta.text_delta)
                out.flush()
            if delta.finished and delta.finish_reason == "error":
                out.write("\n")
                raise InvalidRequest(delta.error or "generation failed")
    out.write("\n")
    out.flush()
    return 0
