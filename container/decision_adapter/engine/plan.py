"""The plan of one scoring job: what to decode on which sequence, decided before anything is decoded.

Pure: no llama.cpp. ``plan_job`` turns a job's prompts (token ids), their answer-label tries, the prefix they
share (the template head and the state) and what the state cache holds into steps that the executor runs in
order, and knows the job's peak memory before the first token is decoded.

The layout is what makes answers trustworthy. llama.cpp's logits depend on how tokens are grouped into
micro-batches (the attention kernel and the quantised matrix kernels change with the row count and the row
offsets) and on which memory cells the keys sit in (the attention sums cells in index order, in tiles of 64
cells). Measured on the embedded model and on Qwen2.5-0.5B, either can move a probability by a few hundredths.
So every job starts from empty memory, and every piece of a prompt is decoded the same way whatever else the
request holds and whatever is cached:

* sequence 0 gets the saved head (template head and system instruction) or, on a cache hit, the saved head and
  state, restored into cells 0, 1, ...; a missing state is decoded in ``batch_tokens`` micro-batches from its
  first token and saved for later requests;
* a state the cache does not hold whole may share a prefix with one it holds (an agent's transcript that grew by
  a few lines): the longest shared prefix that ends on one of the new state's own micro-batch boundaries is
  restored (the saved state loaded, then, where the model's memory has a part no cut brings back, the checkpoint
  saved at that boundary, then its cells past the boundary released) and the state is decoded on from there, in the
  very micro-batches and cells a decode from the head would have used after that boundary;
* each prompt in turn is forked from sequence 0 and its own tokens (question, options, answer position) are
  decoded in micro-batches from its own first token, so they land in the cells right after the state;
* its label paths (labels of several tokens, past 26 options) are then decoded side by side on forks of it,
  one micro-batch per prompt, and every fork is released before the next prompt starts.

A prompt may name its stem (``JobSpec.stems``): its own tokens that do not depend on the order of its options (the
question, up to its options block). Consecutive prompts with the same stem (the orderings of one question, or of its
prior) decode it once: the first forks the state and is decoded whole, its sequence is cut back to the stem
(``Cut``: the rest's cells free again, the next prompt's rest goes into the same cells), and each next prompt
decodes only its rest (options block, answer position) after it (where the memory has a recurrent state, the stem
is decoded on its own, its checkpoint kept, and restored before the cut). The rest's micro-batches are those of the prompt
decoded whole (``batch_tokens`` each from the state's end), the one the stem ends in split in two: its stem part
(decoded by the first prompt) and its rest part. llama.cpp's CPU matrix kernels work on the rows of a micro-batch
in groups (4 on x86-64 for the benchmark model's Q4_K), a group's rows computed together and the rows left over
apart; so the split is moved down to a multiple of ``STEM_ROWS`` rows from that micro-batch's first, where every row
stays in the group it has in the whole micro-batch, and the keys, values and logits are those of the prompt decoded
whole, bit for bit (measured: docs/benchmarks.md, "Orderings that share their stem"). A question's orderings then
cost its stem once and each ordering's options block, in one ``llama_decode`` each (a decode of a few dozen tokens
costs several times its tokens' share on a CPU, so a split that is not needed is not made).

The model's memory (``MemoryKind``) adds two rules where part of it cannot be cut back. A sliding window: the state
is laid out as a restore lays it out, its window checkpointed and restored at each micro-batch boundary and at its
end (``Checkpoint`` then ``RestoreCheckpoint``), so a state decoded, restored whole or restored from a prefix holds
the same cells. A recurrent state: a prompt with a stem is always decoded as its stem and then its rest (the
recurrence is computed in other chunks when a decode is split elsewhere), its checkpoint taken at the stem for the
orderings after it. The checkpoints a saved state keeps for later requests (``JobSpec.prefixes``) are chosen by
``kept_boundaries``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, Union

from .errors import PlanError
from .memory_kind import MemoryKind
from .readout import LabelTrie

# The stem and the rest of a prompt are split at a multiple of this many rows from the first row of their
# micro-batch: the row groups of llama.cpp's CPU matrix kernels (4 rows) are kept whole, with room to spare.
STEM_ROWS = 8

STATE_SEQ = 0
PROMPT_SEQ = 1
FIRST_PATH_SEQ = 2
HEAD_BLOB = "head"
# Where a job keeps what it restores and saves: the head (HEAD_BLOB), a cached state (its state key), the state a
# prefix is restored from (the boundary's digest), and checkpoints (``checkpoint_key``).
BlobKey = Union[str, bytes, tuple]
STATE_END = "end"  # the checkpoint a sliding window is laid out by at the state's end
STEM = "stem"  # a stem's checkpoint (with the index of the first prompt that decoded it)


def checkpoint_key(at: bytes | str, *index: int) -> tuple:
    """The key of a checkpoint: at a state boundary (its digest), at the state's end (STATE_END), or at a stem (STEM
    and the index of the prompt that decoded it)."""
    return ("checkpoint", at, *index)


def kept_boundaries(count: int, policy: str = "spaced") -> frozenset[int]:
    """Which of a saved state's ``count`` micro-batch boundaries (0 .. count - 1) keep their checkpoint, and so serve
    later requests as prefixes, on a memory that needs one: ``every`` one; the ``last`` two; or ``spaced`` (the
    default): the last three and then every boundary a power of two further back (count - 1, - 2, - 3, - 5, - 9,
    ...), about log2(count) + 2 of them. A state that grows (an agent's transcript) is taken up again at its last
    boundary or the one before; one that changes further back finds a boundary at most half the distance back."""
    if policy == "every":
        return frozenset(range(count))
    if policy == "last":
        return frozenset(range(max(0, count - 2), count))
    if policy != "spaced":
        raise ValueError(f"checkpoints must be every, last or spaced, not {policy!r}")
    kept = {count - 1 - back for back in (0, 1, 2) if back < count}
    back = 4
    while back < count:
        kept.add(count - 1 - back)
        back *= 2
    return frozenset(kept)


@dataclass(frozen=True)
class Read:
    """Keep the logits after a chunk's last token: the next-token distribution at a label-trie node."""

    prompt: int  # index of the prompt in the job
    node: tuple[int, ...]  # the label tokens already answered; () is the answer position
    tokens: tuple[int, ...]  # the node's children, whose logits the readout needs


@dataclass(frozen=True)
class Chunk:
    seq: int
    pos: int  # position of the first token
    tokens: tuple[int, ...]
    read: Read | None = None
    also: tuple[int, ...] = ()  # further sequences the tokens belong to (the fused layout's state)


@dataclass(frozen=True)
class Restore:
    """Load a saved sequence (the head, the head and a cached state, or the saved state a prefix is taken from) into
    ``seq``, of which the plan keeps the first ``tokens`` positions (a prefix: cut back to them after)."""

    seq: int
    blob: BlobKey  # HEAD_BLOB, a state-cache key, or a boundary digest (a prefix's saved state)
    tokens: int


@dataclass(frozen=True)
class Checkpoint:
    """Save the part of ``seq``'s memory that no cut brings back (its sliding window, its recurrent state) as it
    stands after ``tokens`` positions, under ``key`` (``checkpoint_key``)."""

    seq: int
    key: BlobKey
    tokens: int


@dataclass(frozen=True)
class RestoreCheckpoint:
    """Put the checkpoint ``key`` back into ``seq`` in place of that part of its memory (the attention cells are
    left as they are: a ``Cut`` to ``tokens`` follows where the sequence holds more)."""

    seq: int
    key: BlobKey
    tokens: int


@dataclass(frozen=True)
class Decode:
    """One llama_decode: these chunks, in this order, as one micro-batch."""

    chunks: tuple[Chunk, ...]

    @property
    def tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


@dataclass(frozen=True)
class Fork:
    src: int
    dst: int


@dataclass(frozen=True)
class Save:
    """Serialise ``seq`` (head and state) into the state cache under ``key``, serving as each of the ``prefixes``
    (the digests of its micro-batch boundaries; where the memory needs checkpoints, those whose checkpoint it keeps)
    too."""

    seq: int
    key: bytes
    tokens: int
    prefixes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Release:
    seqs: tuple[int, ...]


@dataclass(frozen=True)
class Cut:
    """Keep only ``seq``'s first ``tokens`` positions (a prompt's stem, for the next prompt that shares it)."""

    seq: int
    tokens: int


Step = Union[Restore, Checkpoint, RestoreCheckpoint, Decode, Fork, Save, Release, Cut]


@dataclass(frozen=True)
class Limits:
    batch_tokens: int  # most tokens in one llama_decode
    cells: int  # memory cells the job may use (the context size)
    sequences: int  # sequence ids the context has
    fork_by: Literal["copy", "snapshot"] = "copy"
    fused: bool = False  # the fused layout: the state's last micro-batch and the first prompt's own tokens as one
    memory: MemoryKind = MemoryKind()  # what the model's memory is made of: where checkpoints are needed


@dataclass(frozen=True)
class JobSpec:
    """What the planner needs to know about a job."""

    prompts: tuple[tuple[int, ...], ...]
    tries: tuple[LabelTrie, ...]
    head: int  # leading tokens of every prompt that the saved head holds (0: none usable)
    state_end: int  # every prompt shares tokens [0, state_end): head and state, the cacheable prefix
    state_key: bytes | None = None  # where the state is (or will be) cached; None: do not cache it
    state_cached: bool = False
    answered: frozenset[int] = frozenset()  # prompts whose whole answer the cache already holds
    answer_keys: tuple[bytes, ...] = ()  # where each prompt's answer is (or will be) cached; (): not cached
    # The state's micro-batch boundaries (head + batch_tokens, head + 2 * batch_tokens, ... up to state_end), each
    # with the digest of the tokens before it (``cache.boundary_keys``): where a cached prefix may end. The fused
    # layout leaves out state_end (its last micro-batch holds a prompt's tokens).
    boundaries: tuple[tuple[int, bytes], ...] = ()
    # The boundary digests the saved state serves as a prefix for later requests: every boundary's, or where the
    # memory needs checkpoints, those whose checkpoint it keeps (``kept_boundaries``).
    prefixes: tuple[bytes, ...] = ()
    prefix: int = 0  # the state restored from a cached prefix up to this boundary (0: none)
    # For each prompt, where its stem ends (its own tokens before it do not depend on the order of its options:
    # decoded once for consecutive prompts that share them, ``stem_split``); state_end: no stem. (): none has one.
    stems: tuple[int, ...] = ()

    def stem(self, i: int) -> int:
        """Where prompt ``i``'s stem ends (``state_end`` when it has none)."""
        return self.stems[i] if self.stems else self.state_end

    @property
    def prefix_key(self) -> bytes | None:
        """The digest of the boundary the state is restored to, if a prefix is."""
        return next((digest for end, digest in self.boundaries if end == self.prefix), None) if self.prefix else None


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    peak_cells: int
    sequences: int  # sequence ids used, 0 .. sequences - 1
    shared_tokens: int  # state tokens decoded (0 on a cache hit; past the prefix on a prefix hit)
    cached_tokens: int  # state tokens restored from the cache instead (the whole state, or a prefix of it)
    own_tokens: tuple[int, ...]  # tokens decoded for each prompt (0: answered); a shared stem counts with the first
    readout_tokens: int  # label-path tokens decoded

    @property
    def tokens(self) -> int:
        """Tokens the plan decodes: the state, each prompt's own tokens and the label paths."""
        return self.shared_tokens + sum(self.own_tokens) + self.readout_tokens


def chunked(seq: int, tokens: Sequence[int], pos: int, size: int, read: Read | None) -> list[Decode]:
    """``tokens`` on ``seq`` from ``pos``, one micro-batch per ``size`` tokens from the first token; the last
    token's logits are kept when ``read`` is given."""
    steps = []
    for start in range(0, len(tokens), size):
        part = tuple(tokens[start:start + size])
        last = start + size >= len(tokens)
        steps.append(Decode((Chunk(seq, pos + start, part, read if last else None),)))
    return steps


def stem_split(stem: int, state_end: int, batch_tokens: int) -> int:
    """Where a prompt whose stem ends at ``stem`` is split: down to a multiple of ``STEM_ROWS`` rows from the
    first token of the micro-batch (``batch_tokens`` each from ``state_end``) the stem ends in."""
    start = state_end + (stem - state_end) // batch_tokens * batch_tokens
    return start + (stem - start) // STEM_ROWS * STEM_ROWS


def aligned(seq: int, tokens: Sequence[int], begin: int, end: int, origin: int, size: int,
            read: Read | None) -> list[Decode]:
    """Positions [begin, end) of ``tokens`` on ``seq`` in the micro-batches of ``size`` tokens counted from
    ``origin`` (each cut where one of them ends); the last token's logits are kept when ``read`` is given."""
    steps = []
    pos = begin
    while pos < end:
        stop = min(end, origin + ((pos - origin) // size + 1) * size)
        steps.append(Decode((Chunk(seq, pos, tuple(tokens[pos:stop]), read if stop == end else None),)))
        pos = stop
    return steps


def plan_job(spec: JobSpec, limits: Limits) -> Plan:
    """The steps of ``spec`` under ``limits``: the state's (restored, or decoded and saved), then each prompt's
    not already answered (forked from the state, its own tokens, its label paths); PlanError if its peak memory
    is over the context's cells."""
    if not spec.prompts or len(spec.prompts) != len(spec.tries):
        raise ValueError("one label trie per prompt is needed")
    shortest = min(len(p) for p in spec.prompts)
    if not 0 <= spec.head <= spec.state_end < shortest:
        raise ValueError(f"the shared prefix ({spec.head} head, {spec.state_end} in all) must leave every "
                         f"prompt at least one token of its own (shortest prompt: {shortest} tokens)")
    if spec.prefix and not (spec.head < spec.prefix <= spec.state_end and spec.prefix_key is not None):
        raise ValueError(f"a prefix restored to {spec.prefix} must end on one of the state's boundaries")
    if limits.fused and limits.memory.checkpoints:
        raise ValueError("the fused layout decodes the state's end with a prompt: no checkpoint can be taken there")
    if spec.stems and (len(spec.stems) != len(spec.prompts)
                       or not all(spec.state_end <= end < len(p) for end, p in zip(spec.stems, spec.prompts))):
        raise ValueError("each prompt's stem must end within its own tokens, before its last")
    planner = _Planner(spec, limits)
    todo = [i for i in range(len(spec.prompts)) if i not in spec.answered]
    if todo:
        fused_first = planner.state_steps(todo[0], todo[1] if len(todo) > 1 else None)
        for n, i in enumerate(todo):
            before = todo[n - 1] if n else None
            after = todo[n + 1] if n + 1 < len(todo) else None
            planner.prompt_steps(i, own_decoded=i == fused_first, stem_decoded=planner.same_stem(before, i),
                                 stem_kept=planner.same_stem(i, after))
        planner.steps.append(Release((STATE_SEQ,)))
    if planner.peak > limits.cells:
        raise PlanError(f"needs {planner.peak} memory cells at its peak, over the {limits.cells} the model's context "
                        f"has (ADAPTER_CTX_TOKENS)")
    used = FIRST_PATH_SEQ + planner.paths_seqs if planner.paths_seqs else (PROMPT_SEQ + 1 if todo else 0)
    return Plan(tuple(planner.steps), planner.peak, used, planner.shared, planner.cached, tuple(planner.own),
                planner.readout)


class _Planner:
    """The steps of one plan as they are laid out, and the memory each live sequence holds meanwhile."""

    def __init__(self, spec: JobSpec, limits: Limits):
        self.spec, self.limits = spec, limits
        self.snapshot = limits.fork_by == "snapshot"  # a fork holds a copy of its source's cells
        self.steps: list[Step] = []
        self.live: dict[int, int] = {}  # cells each live sequence holds on its own
        self.peak = 0
        self.shared = self.cached = self.readout = self.paths_seqs = 0
        self.own = [0] * len(spec.prompts)
        self.stem_key: tuple = ()  # the checkpoint of the stem the prompts being decoded share (recurrent memory)

    def same_stem(self, i: int | None, j: int | None) -> bool:
        """Whether prompts ``i`` and ``j`` are split at one place after the same tokens: ``j`` can start from the
        stem ``i`` decoded."""
        if i is None or j is None:
            return False
        end = self.split(i)
        return end > self.spec.state_end and end == self.split(j) and \
            self.spec.prompts[i][:end] == self.spec.prompts[j][:end]

    def split(self, i: int) -> int:
        """Where prompt ``i``'s own tokens are split into stem and rest (``state_end``: not split)."""
        return stem_split(self.spec.stem(i), self.spec.state_end, self.limits.batch_tokens)

    def hold(self, seq: int, cells: int) -> None:
        self.live[seq] = self.live.get(seq, 0) + cells
        self.peak = max(self.peak, sum(self.live.values()))

    def fork(self, src: int, dst: int, cells: int) -> None:
        self.steps.append(Fork(src, dst))
        self.hold(dst, cells if self.snapshot else 0)

    def state_steps(self, first: int, second: int | None) -> int | None:
        """Sequence 0 holding head and state: restored from the cache, or the head restored and the state decoded
        (and saved). Returns the prompt whose own tokens went into the state's last micro-batch (the fused
        layout), if any: ``first``, unless it shares its stem with ``second``, the prompt after it."""
        spec, limits = self.spec, self.limits
        if spec.state_cached and spec.state_key is not None:
            self.steps.append(Restore(STATE_SEQ, spec.state_key, spec.state_end))
            self.hold(STATE_SEQ, spec.state_end)
            self.cached = spec.state_end - spec.head
            return None
        start = spec.head
        if spec.prefix and (prefix_key := spec.prefix_key) is not None:
            # The saved state momentarily holds its own cells whole; it was decoded in this context, from empty
            # memory, so it fits the cells, and past the cut only the prefix's are held. Its checkpoint at the
            # boundary goes back first: on a recurrent state the cut is refused unless the state is at the boundary.
            start = spec.prefix
            self.steps.append(Restore(STATE_SEQ, prefix_key, start))
            if limits.memory.checkpoints:
                self.steps.append(RestoreCheckpoint(STATE_SEQ, checkpoint_key(prefix_key), start))
            self.steps.append(Cut(STATE_SEQ, start))
            self.hold(STATE_SEQ, start)
            self.cached = start - spec.head
        elif spec.head:
            self.steps.append(Restore(STATE_SEQ, HEAD_BLOB, spec.head))
            self.hold(STATE_SEQ, spec.head)
        if spec.state_end == start:
            if start > spec.head:
                self.save_state()
            return None
        prompt = spec.prompts[first]
        state = chunked(STATE_SEQ, prompt[start:spec.state_end], start, limits.batch_tokens, None)
        suffix = prompt[spec.state_end:]
        last = state[-1].chunks[0]
        # A prompt whose stem the next one shares is never fused: the next one's rest is decoded from a row-group
        # edge of the prompt's own micro-batch, and fused, the prompt's rows start after the state's.
        fused = limits.fused and not self.same_stem(first, second) \
            and len(last.tokens) + len(suffix) <= limits.batch_tokens
        if fused:
            # One llama_decode for the state's last micro-batch and the first prompt's own tokens: the state's
            # tokens belong to the state and to the prompt, the prompt's to the prompt alone.
            self.steps += state[:-1]
            self.fork(STATE_SEQ, PROMPT_SEQ, spec.state_end)
            self.steps.append(Decode((Chunk(STATE_SEQ, last.pos, last.tokens, None, also=(PROMPT_SEQ,)),
                                      Chunk(PROMPT_SEQ, spec.state_end, suffix,
                                            Read(first, (), spec.tries[first].children[()])))))
            self.hold(PROMPT_SEQ, len(suffix))
            self.own[first] = len(suffix)
        else:
            self.state_decodes(state)
        self.hold(STATE_SEQ, spec.state_end - start)
        self.shared = spec.state_end - start
        self.save_state()
        if limits.memory.compacts and spec.state_end not in dict(spec.boundaries):
            self.compact(STATE_END, spec.state_end)
        return first if fused else None

    def state_decodes(self, decodes: list[Decode]) -> None:
        """The state's micro-batches, each followed, where the memory needs checkpoints and it ends on a boundary,
        by the checkpoint there: kept for later requests where the saved state keeps it (``JobSpec.prefixes``), and
        on a sliding window restored at once, so that the window lies where a restore puts it."""
        memory, kept = self.limits.memory, set(self.spec.prefixes)
        ends = dict(self.spec.boundaries)
        for step in decodes:
            self.steps.append(step)
            end = step.chunks[0].pos + len(step.chunks[0].tokens)
            digest = ends.get(end)
            if digest is None or not memory.checkpoints:
                continue
            if memory.compacts:
                self.compact(digest, end)
            elif digest in kept:
                self.steps.append(Checkpoint(STATE_SEQ, checkpoint_key(digest), end))

    def compact(self, at: bytes | str, tokens: int) -> None:
        """The state's sliding window checkpointed and restored where it stands: laid out in the first cells, as a
        saved state's window is restored."""
        key = checkpoint_key(at)
        self.steps += [Checkpoint(STATE_SEQ, key, tokens), RestoreCheckpoint(STATE_SEQ, key, tokens)]

    def save_state(self) -> None:
        spec = self.spec
        if spec.state_key is not None:
            self.steps.append(Save(STATE_SEQ, spec.state_key, spec.state_end, spec.prefixes))

    def prompt_steps(self, i: int, *, own_decoded: bool, stem_decoded: bool = False, stem_kept: bool = False) -> None:
        """Prompt ``i``: forked from the state, its own tokens decoded from their first (unless the fused state's
        decode held them already), then its label paths side by side on forks of it, each group released. A
        prompt whose stem the prompt before left (``stem_decoded``) decodes only its rest, from the stem's end; the
        prompt's sequence is cut back to its stem for the next prompt (``stem_kept``) instead of released."""
        spec, limits = self.spec, self.limits
        prompt, trie = spec.prompts[i], spec.tries[i]
        split = self.split(i)
        # The first prompt of a stem is decoded whole, not as its stem then its rest: the split falls on a row
        # group's edge, so the stem's keys and values are the same bit for bit, for one llama_decode fewer. A
        # recurrent state is the exception: its state at the stem exists only after a decode that ends there, and a
        # decode split there computes the recurrence in other chunks than one that is not, so every prompt with a
        # stem is split there, alone or not, and the first of a shared stem keeps the checkpoint.
        begin = split if stem_decoded else spec.state_end
        if not own_decoded:
            if not stem_decoded:
                self.fork(STATE_SEQ, PROMPT_SEQ, spec.state_end)
                self.stem_key = checkpoint_key(STEM, i)
            read = Read(i, (), trie.children[()])
            if limits.memory.splits_stems and begin < split:
                self.steps += aligned(PROMPT_SEQ, prompt, begin, split, spec.state_end, limits.batch_tokens, None)
                if stem_kept:
                    self.steps.append(Checkpoint(PROMPT_SEQ, self.stem_key, split))
                self.steps += aligned(PROMPT_SEQ, prompt, split, len(prompt), spec.state_end, limits.batch_tokens,
                                      read)
            else:
                self.steps += aligned(PROMPT_SEQ, prompt, begin, len(prompt), spec.state_end, limits.batch_tokens,
                                      read)
            self.hold(PROMPT_SEQ, len(prompt) - begin)
            self.own[i] = len(prompt) - begin
        paths = trie.inner_nodes
        room = limits.sequences - FIRST_PATH_SEQ
        if paths and room < 1:
            raise PlanError(f"labels of several tokens need at least {FIRST_PATH_SEQ + 1} sequences")
        for group in _groups(paths, room, limits.batch_tokens):
            seqs = tuple(range(FIRST_PATH_SEQ, FIRST_PATH_SEQ + len(group)))
            self.paths_seqs = max(self.paths_seqs, len(group))
            chunks = []
            for seq, path in zip(seqs, group):
                self.fork(PROMPT_SEQ, seq, len(prompt))
                chunks.append(Chunk(seq, len(prompt), path, Read(i, path, trie.children[path])))
                self.hold(seq, len(path))
                self.readout += len(path)
            self.steps.append(Decode(tuple(chunks)))
            self.steps.append(Release(seqs))
            for seq in seqs:
                self.live.pop(seq)
        if stem_kept:
            if limits.memory.splits_stems:
                self.steps.append(RestoreCheckpoint(PROMPT_SEQ, self.stem_key, split))
            self.steps.append(Cut(PROMPT_SEQ, split))
            self.live[PROMPT_SEQ] = split - spec.state_end
        else:
            self.steps.append(Release((PROMPT_SEQ,)))
            self.live.pop(PROMPT_SEQ)


def _groups(paths: list[tuple[int, ...]], seqs: int, batch_tokens: int) -> list[list[tuple[int, ...]]]:
    """Label paths decoded side by side: as many as there are sequences and room in one micro-batch."""
    groups: list[list[tuple[int, ...]]] = []
    tokens = 0
    for path in paths:
        if not groups or len(groups[-1]) == seqs or tokens + len(path) > batch_tokens:
            groups.append([])
            tokens = 0
        groups[-1].append(path)
        tokens += len(path)
    return groups
