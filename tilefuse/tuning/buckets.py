"""M buckets: the token counts that share one ``variant="auto"`` decision (the kernels run the exact M).
M <= 16 is one bucket (decode reads the weights once whatever M is); to 256, one per power of two;
above, two per power of two split at 1.5x: ``(256, 384], (384, 512], (512, 768], ...``.
"""

from __future__ import annotations

FLAT_MAX = 16  # M <= FLAT_MAX: one bucket
OCTAVE_MAX = 256  # FLAT_MAX < M <= OCTAVE_MAX: one bucket per power of two; above, two


def m_bucket(M: int) -> tuple[int, int]:
    """The bucket ``(lo, hi)`` of ``M`` (``lo <= M <= hi``, both inclusive)."""
    if not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise ValueError(f"m_bucket: M must be a positive int, got {M!r}")
    if M <= FLAT_MAX:
        return (1, FLAT_MAX)
    top = 1 << (M - 1).bit_length()  # the smallest power of two >= M
    if M <= OCTAVE_MAX:
        return (top // 2 + 1, top)
    mid = top // 2 + top // 4  # 1.5x the power of two below
    return (top // 2 + 1, mid) if M <= mid else (mid + 1, top)


def bucket_name(bucket: tuple[int, int]) -> str:
    return f"M{bucket[0]}-{bucket[1]}"
