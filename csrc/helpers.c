/* Small C helpers for paths Python would otherwise walk call by call. */

/* Make ctx current on the calling thread unless it already is: one driver call in the common
 * case, instead of a Python round trip through cuCtxGetCurrent and cuCtxSetCurrent. */
CUresult eglcuda_ensure_current(CUcontext ctx)
{
    CUcontext current = NULL;
    CUresult status = cuCtxGetCurrent(&current);
    if (status != CUDA_SUCCESS || current == ctx)
        return status;
    return cuCtxSetCurrent(ctx);
}
