"""The order in which a timing grid runs its policies, repetition by repetition: a Williams design.

A repetition runs every policy once, one after another; its order puts each policy in a slot (0 = first). Any
bias of a slot (the first run after a capacity change, the run after a heavy one) then falls on whichever
policy sits there, so the orders of a sequence of repetitions are balanced:

- every policy sits in every slot equally often, and
- every ordered pair of policies (a directly before b) is adjacent equally often,

over one cycle of `cycle_length(k)` repetitions (k policies). A Williams design gives both. Over the labels
0..k-1 let s = 0, 1, k-1, 2, k-2, 3, ... (k terms): its steps s[p+1] - s[p] are +1, -2, +3, -4, ... (mod k).
Row j of the square is s + j (mod k), j = 0..k-1: a Latin square, so every label takes every slot once. For
even k the k-1 steps are distinct and nonzero mod k, so every ordered pair is adjacent once, and the mirror
(reversal) of row j is row j + k/2. For odd k the steps take half the nonzero residues, each twice (k = 5:
1, 3, 3, 1), so the square alone is not pair-balanced; its mirrored rows take the negated steps, so the square
with its k mirrored rows is: 2k rows, every label in every slot twice, every ordered pair adjacent twice.

The cycle lists each row next to its mirror (odd k: row j, then row j reversed; even k: row j, then row
j + k/2), so any two consecutive repetitions starting at an even index give every policy the same mean slot,
(k - 1) / 2. The listed policy at position p carries label s[p], so index 0 (row 0) is the listed order and
index 1 its reverse, as in the warm-up and for two policies the whole cycle.

Repetition r of a grid whose profile has `rotation` q and R repetitions uses index q * R + r (bench/run.py),
so the order continues across stored runs (scripts/record_runs.py measures run k with rotation k - 1).

The A/A pair (Settings.aa_pair): demand runs twice per repetition, as two arms. The design needs distinct
labels, so its second arm takes the slot label `demand#B` (b_slot), listed after the policies (slots); a run's
(policy, arm) is split from its label by slot_run, and only the policy reaches a row's `policy` column or the
runner: both arms run exactly demand's code.
"""

from __future__ import annotations

from collections.abc import Sequence

AA_POLICY = "demand"  # the policy the A/A pair runs twice
AA = f"A/A ({AA_POLICY} over {AA_POLICY})"  # the A/A's name wherever it is shown
ARMS = ("A", "B")  # a row's `arm`: B for the A/A pair's second run of demand in a repetition, else A
B_ARM = "#B"  # the suffix of the B arm's slot label (never a policy spec's: check_policy refuses '#')


def b_slot(policy: str) -> str:
    """The slot label of `policy`'s B arm: `demand#B`."""
    return f"{policy}{B_ARM}"


def slots(policies: Sequence[str], aa_pair: bool) -> tuple[str, ...]:
    """The labels a repetition runs: the policies, then demand's B arm when `aa_pair` and demand is listed."""
    policies = tuple(policies)
    return policies + ((b_slot(AA_POLICY),) if aa_pair and AA_POLICY in policies else ())


def slot_run(slot: str) -> tuple[str, str]:
    """(policy, arm) of a slot label: ('demand', 'B') for `demand#B`, (label, 'A') for any other."""
    return (slot[: -len(B_ARM)], "B") if slot.endswith(B_ARM) else (slot, "A")


def primary(rows):
    """The bench rows of arm A: one run per (cell, repetition, policy), without the A/A pair's B arm. Rows
    without an `arm` column (written before it) are all arm A. What every table or figure that pivots rows by
    policy reads."""
    if "arm" not in rows.columns:
        return rows
    keep = rows.arm.astype(str) != "B"
    return rows if keep.all() else rows[keep]


def row_slots(rows):
    """Each row's slot label: its policy, and demand's A/A arm B as demand#B (b_slot)."""
    pol = rows.policy.astype(str)
    if "arm" not in rows:
        return pol
    return pol.where(rows.arm.astype(str) != "B", pol + B_ARM)


def cycle_length(k: int) -> int:
    """Repetitions in one balanced cycle of k policies: k when k is even, 2k when k is odd."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the number of policies must be an integer >= 1, got {k!r}")
    return k if k % 2 == 0 else 2 * k


def _base_row(k: int) -> list[int]:
    """s = 0, 1, k-1, 2, k-2, ...: the first row of the Williams square of k policies."""
    row, low, high = [0], 1, k - 1
    while len(row) < k:
        row.append(low)
        low += 1
        if len(row) < k:
            row.append(high)
            high -= 1
    return row


def slot_order(policies: Sequence[str], index: int) -> tuple[str, ...]:
    """The order of the `index`-th repetition (index >= 0, counted over a whole sequence of repetitions):
    `policies` permuted by row index % cycle_length(len(policies)) of their Williams design (module
    docstring)."""
    policies = tuple(policies)
    if not policies:
        raise ValueError("slot_order needs at least one policy, got an empty list")
    if len(set(policies)) != len(policies):
        twice = sorted({p for p in policies if policies.count(p) > 1})
        raise ValueError(
            f"slot_order needs distinct policies; {', '.join(map(repr, twice))} listed twice "
            f"in {list(policies)}"
        )
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"slot_order's repetition index must be an integer >= 0, got {index!r}")
    k = len(policies)
    c = index % cycle_length(k)
    if k % 2 == 0:
        shift, mirrored = c // 2 + (c % 2) * (k // 2), False
    else:
        shift, mirrored = c // 2, c % 2 == 1
    base = _base_row(k)
    where = {label: pos for pos, label in enumerate(base)}  # the listed policy p carries label s[p]
    row = [policies[where[(label + shift) % k]] for label in base]
    return tuple(row[::-1] if mirrored else row)
