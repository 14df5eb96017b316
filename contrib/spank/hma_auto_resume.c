/*
 * hma_auto_resume.so: `srun --auto-resume[=N] ...` hands the step to `hma srun --auto-resume=N`.
 *
 * A SPANK plugin (docs/auto-resume.md, "The srun plugin"). plugstack.conf:
 *
 *     optional /usr/lib/x86_64-linux-gnu/slurm-wlm/hma_auto_resume.so hma=/usr/bin/hma
 *
 * It registers --auto-resume[=N] (N >= 1, default 1) for srun. In srun (local context), once
 * srun has parsed its options and the option was given, it rebuilds srun's command line from
 * /proc/self/cmdline without the option, sets HMA_AUTORESUME_INNER=1 and replaces srun with
 *
 *     <hma> srun --auto-resume=N -- <srun's other arguments>
 *
 * hma then runs the real srun (whose copy of this plugin sees HMA_AUTORESUME_INNER, removes it
 * so that the step's tasks do not inherit it, and does nothing) and decides after a failure.
 * Any error (bad N, hma missing or not executable, unreadable command line) ends srun with a
 * message and exit status 1: srun never runs without the auto-resume that was asked for. In
 * every other context the plugin only registers the option. No shell, no fixed-size buffers.
 *
 * Build: make -C contrib/spank (contrib/spank/Makefile), against the headers of the Slurm that
 * loads it (Slurm refuses a plugin built for another major release).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(hma_auto_resume, 1);

#define OPTION "auto-resume"
#define INNER_ENV "HMA_AUTORESUME_INNER"
#define DEFAULT_HMA "/usr/bin/hma"
#define MAX_ATTEMPTS 1000000u
#define MIN_PREFIX 4 /* "--auto" and longer prefixes count as the option (getopt_long) */

static unsigned int attempts;    /* 0: option not given */
static unsigned int occurrences; /* how many times srun's getopt passed us the option */
static const char *hma_path = DEFAULT_HMA;

static int option_cb(int val, const char *optarg, int remote);

static struct spank_option auto_resume_option = {
    OPTION, "N",
    "on a hardware failure, resume the step up to N times (default 1) through hma srun "
    "(docs/auto-resume.md)",
    2, 0, option_cb,
};

/* Parse N (NULL: the default 1); 0 when invalid. */
static unsigned int parse_attempts(const char *text)
{
    unsigned long value = 0;
    size_t i;

    if (text == NULL)
        return 1;
    if (text[0] == '\0' || strlen(text) > 7)
        return 0;
    for (i = 0; text[i] != '\0'; i++) {
        if (text[i] < '0' || text[i] > '9')
            return 0;
        value = value * 10 + (unsigned long)(text[i] - '0');
    }
    if (value < 1 || value > MAX_ATTEMPTS)
        return 0;
    return (unsigned int)value;
}

static int option_cb(int val, const char *optarg, int remote)
{
    unsigned int n;

    (void)val;
    if (remote)
        return 0;
    n = parse_attempts(optarg);
    if (n == 0) {
        slurm_error("hma_auto_resume: --auto-resume=%s: not a whole number from 1 to %u "
                    "(write --auto-resume or --auto-resume=N)", optarg, MAX_ATTEMPTS);
        return -1;
    }
    attempts = n;
    occurrences++;
    return 0;
}

/* Whether `arg` is how getopt_long spells our option: --auto-resume, --auto-resume=N, or an
 * unambiguous prefix of at least MIN_PREFIX letters. `*bare` tells whether it has no "=N". */
static int is_option(const char *arg, int *bare)
{
    const char *name, *eq;
    size_t len;

    if (strncmp(arg, "--", 2) != 0)
        return 0;
    name = arg + 2;
    eq = strchr(name, '=');
    len = eq ? (size_t)(eq - name) : strlen(name);
    if (len < MIN_PREFIX || len > strlen(OPTION) || strncmp(name, OPTION, len) != 0)
        return 0;
    *bare = (eq == NULL);
    return 1;
}

static int all_digits(const char *text)
{
    if (*text == '\0')
        return 0;
    for (; *text; text++)
        if (*text < '0' || *text > '9')
            return 0;
    return 1;
}

/*
 * The argv of the hma command for srun's command line `args` (`n`
 * strings, args[0] is srun itself) where srun's getopt saw the option `count` times. The first
 * `count` tokens spelled as the option are dropped (srun stops at its first non-option, so they
 * precede the command; later ones belong to the command). Returns a NULL-terminated array
 * (pointers into `args`, free only the array), or NULL with `*why` set.
 */
static char **build_argv(const char *hma, unsigned int n_attempts, unsigned int count,
                         char **args, size_t n, char *numbuf, size_t numlen, const char **why)
{
    char **out;
    size_t i, k = 0, dropped = 0;
    int bare;

    if (n > (SIZE_MAX / sizeof(char *)) - 6) {
        *why = "srun's command line is too long";
        return NULL;
    }
    out = calloc(n + 6, sizeof(char *));
    if (out == NULL) {
        *why = "out of memory";
        return NULL;
    }
    if (snprintf(numbuf, numlen, "--auto-resume=%u", n_attempts) >= (int)numlen) {
        free(out);
        *why = "internal error formatting --auto-resume";
        return NULL;
    }
    out[k++] = (char *)hma;
    out[k++] = "srun";
    out[k++] = numbuf;
    out[k++] = "--";
    for (i = 1; i < n; i++) {
        if (dropped < count && is_option(args[i], &bare)) {
            dropped++;
            if (bare && i + 1 < n && all_digits(args[i + 1])) {
                free(out);
                *why = "srun takes the value of --auto-resume only after '=': write "
                       "--auto-resume=N (a separate N would be run as the command)";
                return NULL;
            }
            continue;
        }
        out[k++] = args[i];
    }
    if (dropped != count) {
        free(out);
        *why = "cannot find --auto-resume in srun's command line (give it as --auto-resume or "
               "--auto-resume=N)";
        return NULL;
    }
    if (k == 4) {
        free(out);
        *why = "no command given";
        return NULL;
    }
    out[k] = NULL;
    return out;
}

/* /proc/self/cmdline, whole (it can be far larger than any fixed buffer): `*len` bytes. */
static char *read_cmdline(size_t *len)
{
    size_t size = 4096, used = 0;
    char *buf = malloc(size), *bigger;
    ssize_t got;
    int fd;

    if (buf == NULL)
        return NULL;
    fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        free(buf);
        return NULL;
    }
    for (;;) {
        if (used == size) {
            if (size > SIZE_MAX / 2 || (bigger = realloc(buf, size * 2)) == NULL) {
                close(fd);
                free(buf);
                return NULL;
            }
            buf = bigger;
            size *= 2;
        }
        got = read(fd, buf + used, size - used);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            close(fd);
            free(buf);
            return NULL;
        }
        if (got == 0)
            break;
        used += (size_t)got;
    }
    close(fd);
    if (used == 0 || buf[used - 1] != '\0') {
        free(buf);
        return NULL;
    }
    *len = used;
    return buf;
}

/* Split the NUL-separated `buf` into a vector; `*n` strings. */
static char **split_cmdline(char *buf, size_t len, size_t *n)
{
    size_t i, count = 0, k = 0;
    char **vec;

    for (i = 0; i < len; i++)
        if (buf[i] == '\0')
            count++;
    vec = calloc(count + 1, sizeof(char *));
    if (vec == NULL)
        return NULL;
    vec[k++] = buf;
    for (i = 0; i + 1 < len; i++)
        if (buf[i] == '\0')
            vec[k++] = buf + i + 1;
    *n = count;
    return vec;
}

static void fail(const char *what, const char *detail)
{
    slurm_error("hma_auto_resume: %s%s%s; srun does not run without the auto-resume asked for",
                what, detail ? ": " : "", detail ? detail : "");
    exit(1); /* an `optional` plugin's failing callback would be ignored: stop srun here */
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    int i;
    spank_context_t ctx = spank_context();

    if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE)
        return 0;
    for (i = 0; i < ac; i++) {
        if (strncmp(av[i], "hma=", 4) == 0 && av[i][4] != '\0') {
            hma_path = av[i] + 4;
        } else {
            slurm_error("hma_auto_resume: unknown plugstack.conf argument '%s' (hma=PATH)", av[i]);
            return -1;
        }
    }
    if (spank_option_register(sp, &auto_resume_option) != ESPANK_SUCCESS) {
        slurm_error("hma_auto_resume: cannot register --%s", OPTION);
        return -1;
    }
    return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    char *buf, **args, **argv, numbuf[32];
    const char *why = NULL;
    size_t len = 0, n = 0;
    sigset_t none;

    (void)sp, (void)ac, (void)av;
    if (spank_context() != S_CTX_LOCAL)
        return 0;
    if (getenv(INNER_ENV) != NULL) { /* started by hma srun: plain srun, tasks do not inherit */
        if (unsetenv(INNER_ENV) != 0)
            fail("cannot unset " INNER_ENV, strerror(errno));
        return 0;
    }
    if (attempts == 0)
        return 0;
    if (hma_path[0] != '/')
        fail("hma= must be an absolute path", hma_path);
    if (access(hma_path, X_OK) != 0)
        fail(hma_path, strerror(errno));
    buf = read_cmdline(&len);
    if (buf == NULL)
        fail("cannot read /proc/self/cmdline", strerror(errno));
    args = split_cmdline(buf, len, &n);
    if (args == NULL)
        fail("out of memory", NULL);
    argv = build_argv(hma_path, attempts, occurrences, args, n, numbuf, sizeof(numbuf),
                             &why);
    if (argv == NULL)
        fail(why, NULL);
    if (setenv(INNER_ENV, "1", 1) != 0)
        fail("cannot set " INNER_ENV, strerror(errno));
    if (sigemptyset(&none) != 0 || sigprocmask(SIG_SETMASK, &none, NULL) != 0)
        fail("cannot unblock signals", strerror(errno));
    execv(hma_path, argv);
    fail(hma_path, strerror(errno));
    return -1;
}
