"""Out-of-memory on the accelerator: telling it apart from other failures, and giving the
memory back before the next job."""

from __future__ import annotations

# Allocation failures that surface as a plain RuntimeError (cuBLAS/cuDNN handles and
# workspaces, older torch builds): they heal like torch.OutOfMemoryError.
_OOM_MARKERS = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
    "HIP out of memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)


def free_accelerator_memory() -> None:
    """Collect what the failed run left (frames in reference cycles), then hand the
    allocator's cached blocks back so the next job starts from a clean pool. Call it
    outside the except clause: the traceback's frames pin the activations until then."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
