"""Which prefixes the rows of a decode batch share, kept once by the decode state (`strop.engine.decode`): the
samples of one prompt share all of it, the later turns of episodes branched at one state share that state, and
every prompt of a batch shares its system prompt and tool schemas.

    groups = prefix_groups(prompts, rows)          # [(length, prompt indices)], each prompt in at most one group
    keys = batch_order(lengths, groups)            # sort keys that keep a group's rows in one batch
"""

from __future__ import annotations

# a shared prefix shorter than this is kept in each row: attending to it apart costs a kernel call a layer
MIN_SHARED = 32


def common_prefix(prompts: list) -> int:
    """How many first tokens all the prompts have in common (0 for none)."""
    if not prompts:
        return 0
    first, length = prompts[0], min(len(p) for p in prompts)
    for prompt in prompts[1:]:
        length = next((i for i in range(length) if prompt[i] != first[i]), length)
    return length


def prefix_groups(prompts: list, rows: list[int] | None = None) -> list[tuple[int, list[int]]]:
    """Which prompts' shared first tokens a decode state keeps once: [(length, indices into `prompts`)], each
    prompt in at most one group, every group's prompts starting with the same `length` tokens. `rows[i]`: how many
    rows sample prompt i (1 each when None).

    Sorted, prompts that share a long prefix are neighbours. A run of neighbours becomes a group (the samples of
    one prompt, the turns of episodes branched at one state) while its common prefix stays at least MIN_SHARED
    longer than the one all the prompts share, and the positions it saves, (rows - 1) x length, are no fewer than
    the run and the next prompt would save apart. The prompts in no such group form one more group on the prefix
    every prompt shares, when that is MIN_SHARED or longer (a system prompt and tool schemas)."""
    if not prompts:
        return []
    rows = rows or [1] * len(prompts)
    every = common_prefix(prompts)
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    groups, run, length = [], [order[0]], len(prompts[order[0]])

    def close():
        if sum(rows[i] for i in run) >= 2 and length >= max(every + MIN_SHARED, MIN_SHARED):
            groups.append((length, sorted(run)))

    for i in order[1:]:
        joined = min(length, common_prefix([prompts[run[0]], prompts[i]]))
        members = sum(rows[j] for j in run)
        alone = (members - 1) * length + (rows[i] - 1) * len(prompts[i])  # saved by two groups
        if joined >= every + MIN_SHARED and (members + rows[i] - 1) * joined >= alone:
            run.append(i)
            length = joined
        else:
            close()
            run, length = [i], len(prompts[i])
    close()
    grouped = {i for _, members in groups for i in members}
    rest = [i for i in range(len(prompts)) if i not in grouped]
    if rest and every >= MIN_SHARED:
        groups.append((every, rest))
    return groups


def batch_order(lengths: list[int], groups: list[tuple[int, list[int]]]) -> list[tuple[int, int, int]]:
    """A sort key per prompt for cutting rows into decode batches: by length (batches of similar prompt length
    waste less on padding), except that a group's prompts (`prefix_groups`) stay together at the place of its
    shortest, so that they share a batch and its prefix is kept once for all of them."""
    keys = [(n, -1, n) for n in lengths]
    for g, (_, members) in enumerate(groups):
        shortest = min(lengths[i] for i in members)
        for i in members:
            keys[i] = (shortest, g, lengths[i])
    return keys
