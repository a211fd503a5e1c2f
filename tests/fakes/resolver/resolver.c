/* A stand-in for the system resolver, preloaded (LD_PRELOAD) into a test's process: getaddrinfo
 * answers two made-up names and leaves every other to the real one.
 *   slow.test  after FAKE_RESOLVER_DELAY_S seconds (default 3): 127.0.0.1, as a slow DNS server
 *   dual.test  ::1 first, then 127.0.0.1, as a name with both kinds of address (for the families
 *              asked for), the order a resolver that prefers IPv6 gives them
 * Built by tests/fakes/build.py (build_resolver). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int (*getaddrinfo_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

static getaddrinfo_fn real_getaddrinfo(void)
{
    static getaddrinfo_fn real;
    if (!real) real = (getaddrinfo_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    return real;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints, struct addrinfo **res)
{
    if (node && strcmp(node, "slow.test") == 0) {
        const char *delay = getenv("FAKE_RESOLVER_DELAY_S");
        usleep((useconds_t)((delay ? atof(delay) : 3.0) * 1e6));
        return real_getaddrinfo()("127.0.0.1", service, hints, res);
    }
    if (node && strcmp(node, "dual.test") == 0) {
        int family = hints ? hints->ai_family : AF_UNSPEC;
        struct addrinfo *six = NULL, *four = NULL;
        struct addrinfo only = hints ? *hints : (struct addrinfo){0};
        only.ai_flags |= AI_NUMERICHOST;
        if (family == AF_UNSPEC || family == AF_INET6) {
            only.ai_family = AF_INET6;
            if (real_getaddrinfo()("::1", service, &only, &six)) six = NULL;
        }
        if (family == AF_UNSPEC || family == AF_INET) {
            only.ai_family = AF_INET;
            if (real_getaddrinfo()("127.0.0.1", service, &only, &four)) four = NULL;
        }
        if (!six && !four) return EAI_NONAME;
        if (!six) { *res = four; return 0; }
        struct addrinfo *last = six;
        while (last->ai_next) last = last->ai_next;
        last->ai_next = four;  /* (freeaddrinfo walks the chain: one list of two allocations is fine for glibc) */
        *res = six;
        return 0;
    }
    return real_getaddrinfo()(node, service, hints, res);
}
