"""Statistical and reproducibility checks of the sampler through the full pipeline.

scipy is not a dependency: the chi-square statistic is computed here and compared with fixed
critical values (upper 0.1% quantiles of the chi-square distribution).  Generators are seeded,
so the tests are deterministic.
"""

from __future__ import annotations

import random

import torch

from metrale_core.sampling import DefaultSampler, LogitPipeline, PositionKind

#: chi-square critical values at alpha = 0.001, by degrees of freedom.
CHI2_CRIT_001 = {
    1: 10.828,
    2: 13.816,
    3: 16.266,
    4: 18.467,
    5: 20.515,
    6: 22.458,
    7: 24.322,
    8: 26.124,
    9: 27.877,
    10: 29.588,
    11: 31.264,
    12: 32.909,
}

LOGITS = torch.tensor([1.2, -0.3, 0.8, 2.0, -1.5, 0.1, 1.7, -0.7, 0.4, 1.0, -2.2, 0.9])
PARAMS = dict(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05)


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    support = probs > 0
    expected = probs[support] * counts.sum()
    stat = ((counts[support] - expected) ** 2 / expected).sum().item()
    return stat, int(support.sum()) - 1


def test_sampled_frequencies_follow_processed_distribution(make_row):
    pipe = LogitPipeline([], DefaultSampler())
    n_rows, n_steps = 200, 100
    rows = [make_row(seed=1000 + i, **PARAMS) for i in range(n_rows)]
    logits = LOGITS.expand(n_rows, -1).contiguous()
    kinds = [PositionKind.FINAL_DECODE] * n_rows
    probs = torch.softmax(pipe.processed_logits(logits[:1], rows[:1], kinds[:1])[0].double(), dim=-1)
    drawn = [t for _ in range(n_steps) for t in pipe.sample(logits, rows, kinds).token_ids]
    counts = torch.bincount(torch.tensor(drawn), minlength=LOGITS.numel()).double()
    assert counts.sum() == n_rows * n_steps
    assert counts[probs == 0].sum() == 0, "a token removed by top-k/top-p/min-p was drawn"
    assert 4 <= int((probs > 0).sum()) < LOGITS.numel(), "the truncation should matter here"
    stat, dof = _chi2(counts, probs)
    print(f"chi2={stat:.2f} with {dof} dof")
    assert stat < CHI2_CRIT_001[dof], f"chi2={stat:.2f} with {dof} dof"
    # the test has power: the untruncated distribution is rejected
    raw = torch.softmax(LOGITS.double() / PARAMS["temperature"], dim=-1)
    raw_stat, raw_dof = _chi2(counts, raw)
    assert raw_stat > 10 * CHI2_CRIT_001[raw_dof]


def _generate(pipe, steps, seed, batch_mates, make_row, shuffle_seed):
    """Tokens of the request seeded ``seed`` over ``steps`` steps, batched with ``batch_mates``."""
    vocab = 32
    target = make_row(prompt=[1, 2, 3], seed=seed, temperature=0.9, top_p=0.95, presence_penalty=0.3)
    others = [make_row(prompt=[4], seed=s, temperature=t) for s, t in batch_mates]
    shuffler = random.Random(shuffle_seed)
    for _step in range(steps):
        batch = [target, *others]
        shuffler.shuffle(batch)
        # logits depend on the row's history only, as a model's would
        logits = torch.stack(
            [
                torch.sin(torch.arange(vocab, dtype=torch.float32) * (1 + len(r.output_ids)) + r.prompt_ids[0]) * 3.0
                for r in batch
            ]
        )
        kinds = [PositionKind.FINAL_DECODE] * len(batch)
        out = pipe.sample(logits, batch, kinds)
        for r, token in zip(batch, out.token_ids):
            r.output_ids.append(token)
    return target.output_ids


def test_seed_reproducible_whatever_the_batch(make_row):
    pipe = LogitPipeline([], DefaultSampler())
    alone = _generate(pipe, 30, 1234, [], make_row, 0)
    with_others = _generate(pipe, 30, 1234, [(1, 1.0), (2, 0.0), (3, 0.5)], make_row, 1)
    reordered = _generate(pipe, 30, 1234, [(9, 0.0), (8, 1.2), (7, 0.7), (6, 0.0), (5, 2.0)], make_row, 2)
    assert alone == with_others == reordered
    assert len(set(alone)) > 3
    assert _generate(pipe, 30, 4321, [], make_row, 0) != alone
