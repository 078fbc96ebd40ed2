"""Stub, NOT numba: makani's zenith angle uses @jit(forceobj=True) (object mode),
which is plain Python; the decorators here return the function unchanged."""
def jit(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f
njit = jit
