#!/usr/bin/env bash
# Run a short eglcuda round trip (tests/fakes/driver/roundtrip.py) against the fake driver under
# valgrind's memcheck, or under AddressSanitizer.
#
#   tests/fakes/driver/run_under_valgrind.sh            # valgrind memcheck
#   tests/fakes/driver/run_under_valgrind.sh --asan     # the fake built with -fsanitize=address
#   tests/fakes/driver/run_under_valgrind.sh -- ARGS...  # python3 ARGS... instead of the round trip
#   tests/fakes/driver/run_under_valgrind.sh --asan -- -m pytest tests/fake -q
#       # the whole fake tier with the fake built with ASan (the children inherit the preload)
#
# Exits 1 when valgrind (or ASan) reports an error: invalid reads or writes, uses of
# uninitialised values, invalid frees, and memory definitely lost by the fake or by eglcuda's
# compiled parts. Python runs with PYTHONMALLOC=malloc so that valgrind sees every allocation;
# known noise from the interpreter and NumPy is suppressed (python.supp next to this script,
# and the distribution's python3.supp where it exists).
#
# Settings: ROUNDTRIP_ROUNDS (default 12), ROUNDTRIP_SEED, FAKE_OUT (build directory, default a
# temporary one), VALGRIND_ARGS (extra valgrind arguments).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
python=$(python3 -c 'import sys; print(sys.executable)')  # the interpreter itself, not a shim
out=${FAKE_OUT:-$(mktemp -d)}
mode=valgrind
if [[ ${1:-} == --asan ]]; then
    mode=asan
    shift
fi
if [[ ${1:-} == -- ]]; then
    shift
    program=("$@")
else
    program=("$here/roundtrip.py")
fi

build_flags=()
[[ $mode == asan ]] && build_flags=(--asan)
python3 "$here/../build.py" "$out" "${build_flags[@]}" >/dev/null

export EGLCUDA_LIBEGL="$out/libfake_egl.so" EGLCUDA_LIBCUDA="$out/libfake_cuda.so"
export EGLCUDA_LIBVULKAN=/nonexistent/libvulkan.so.1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONMALLOC=${PYTHONMALLOC:-pymalloc}

if [[ $mode == asan ]]; then
    libasan=$(gcc -print-file-name=libasan.so)
    # Python itself leaks at exit by design: leak checking would report the interpreter.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:exitcode=1}
    export EGLCUDA_FAKE_ASAN=1  # tests/fake builds its own copy of the fake with ASan too
    echo "AddressSanitizer: LD_PRELOAD=$libasan $python ${program[*]}" >&2
    LD_PRELOAD="$libasan" "$python" "${program[@]}"
    exit $?
fi

suppressions=(--suppressions="$here/python.supp")
for candidate in /usr/lib/valgrind/python3.supp /usr/lib/x86_64-linux-gnu/valgrind/python3.supp; do
    [[ -f $candidate ]] && suppressions+=(--suppressions="$candidate")
done
log="$out/valgrind.log"
echo "valgrind: $python ${program[*]} (log: $log)" >&2
status=0
valgrind --tool=memcheck --error-exitcode=1 --track-origins=yes --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=30 \
    "${suppressions[@]}" --log-file="$log" ${VALGRIND_ARGS:-} "$python" "${program[@]}" || status=$?
grep -E "ERROR SUMMARY|definitely lost|Invalid|uninitialised|Mismatched" "$log" | sort | uniq -c >&2 || true
if [[ $status -ne 0 ]]; then
    echo "valgrind reported errors (exit $status); see $log" >&2
fi
exit $status
