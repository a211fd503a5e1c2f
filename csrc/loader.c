/* Run-time loading for the generated function table (see build_ffi.py).
 *
 * eglcuda links to neither libEGL nor libcuda: Python opens them with eglcuda_dlopen, looks up
 * each entry's symbol (dlsym for core and CUDA calls, eglGetProcAddress for EGL extensions once
 * the extension is listed) and stores the address with eglcuda_bind. Calls then go straight
 * from the compiled wrappers through the table, with no per-call lookup. */
#include <dlfcn.h>

void *eglcuda_dlopen(const char *path)
{
    /* RTLD_LOCAL: the libraries' symbols must not leak into later-loaded modules. */
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

void *eglcuda_dlsym(void *handle, const char *symbol)
{
    dlerror();
    return dlsym(handle, symbol);
}

const char *eglcuda_dlerror(void)
{
    const char *message = dlerror();
    return message ? message : "";
}

int eglcuda_entry_count(void)
{
    return (int)(sizeof(eglcuda_entries) / sizeof(eglcuda_entries[0]));
}

const char *eglcuda_entry_name(int index)
{
    return eglcuda_entries[index].name;
}

const char *eglcuda_entry_symbol(int index)
{
    return eglcuda_entries[index].symbol;
}

const char *eglcuda_entry_requires(int index)
{
    return eglcuda_entries[index].requires;
}

void eglcuda_bind(int index, void *address)
{
    *eglcuda_entries[index].slot = address;
}

int eglcuda_is_bound(int index)
{
    return *eglcuda_entries[index].slot != NULL;
}
