/*
 * Stand-in for srun around contrib/spank/hma_auto_resume.so (tests/spankplugin.py): it exports
 * the SPANK calls the plugin makes (spank_context, spank_option_register, slurm_error), loads
 * the plugin with dlopen, calls slurm_spank_init with the plugstack.conf arguments, parses its
 * own command line with getopt_long as srun does ("+": options end at the first non-option;
 * abbreviations; the plugin's option with its has_arg), calls the option's callback per
 * occurrence, then slurm_spank_init_post_opt. The plugin reads this process's
 * /proc/self/cmdline, so argv[1..] stand for srun's arguments.
 *
 * Environment: HARNESS_PLUGIN (the .so), HARNESS_CONTEXT (local|remote|allocator, default
 * local), HARNESS_PLUGARGS (plugstack.conf arguments, separated by spaces).
 * Exit: 0 after post_opt returned ("harness: srun runs" on stdout, with HMA_AUTORESUME_INNER),
 * 2 unknown option, 3 init failed, 4 load failed, 255 option callback refused (as srun).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

static struct spank_option *registered;
static spank_context_t context = S_CTX_LOCAL;

spank_context_t spank_context(void)
{
    return context;
}

spank_err_t spank_option_register(spank_t sp, struct spank_option *opt)
{
    (void)sp;
    registered = opt;
    return ESPANK_SUCCESS;
}

void slurm_error(const char *format, ...)
{
    va_list ap;

    va_start(ap, format);
    fputs("srun: error: ", stderr);
    vfprintf(stderr, format, ap);
    fputc('\n', stderr);
    va_end(ap);
}

typedef int (*spank_call)(spank_t, int, char **);

int main(int argc, char **argv)
{
    const char *plugin = getenv("HARNESS_PLUGIN"), *ctx = getenv("HARNESS_CONTEXT");
    char *plugargs[16], *spec = getenv("HARNESS_PLUGARGS"), *tok, *inner;
    int nargs = 0, c, rc;
    void *handle;
    spank_call init, post_opt;
    struct option longopts[] = {
        {"nodes", required_argument, NULL, 'N'},      {"job-name", required_argument, NULL, 'J'},
        {"label", no_argument, NULL, 'l'},            {"ntasks", required_argument, NULL, 'n'},
        {"kill-on-bad-exit", optional_argument, NULL, 'K'},
        {NULL, 0, NULL, 1000},                        {NULL, 0, NULL, 0},
    };

    if (ctx && strcmp(ctx, "remote") == 0)
        context = S_CTX_REMOTE;
    else if (ctx && strcmp(ctx, "allocator") == 0)
        context = S_CTX_ALLOCATOR;
    handle = plugin ? dlopen(plugin, RTLD_NOW) : NULL;
    if (handle == NULL) {
        fprintf(stderr, "harness: cannot load %s: %s\n", plugin ? plugin : "(unset)", dlerror());
        return 4;
    }
    init = (spank_call)dlsym(handle, "slurm_spank_init");
    post_opt = (spank_call)dlsym(handle, "slurm_spank_init_post_opt");
    if (init == NULL || post_opt == NULL) {
        fprintf(stderr, "harness: plugin lacks slurm_spank_init or _init_post_opt\n");
        return 4;
    }
    for (tok = spec ? strtok(spec, " ") : NULL; tok && nargs < 16; tok = strtok(NULL, " "))
        plugargs[nargs++] = tok;
    if (init(NULL, nargs, plugargs) != 0) {
        fprintf(stderr, "harness: slurm_spank_init failed\n");
        return 3;
    }
    if (registered != NULL) {
        longopts[5].name = registered->name;
        longopts[5].has_arg = registered->has_arg;
    }
    while ((c = getopt_long(argc, argv, "+N:J:ln:K::", longopts, NULL)) != -1) {
        if (c == '?')
            return 2;
        if (c == 1000 && registered->cb(registered->val, optarg, context == S_CTX_REMOTE) != 0) {
            fprintf(stderr, "srun: error: Invalid --%s argument: %s\n", registered->name,
                    optarg ? optarg : "(null)");
            return 255;
        }
    }
    rc = post_opt(NULL, nargs, plugargs);
    inner = getenv("HMA_AUTORESUME_INNER");
    printf("harness: srun runs (post_opt %d, HMA_AUTORESUME_INNER %s)\n", rc,
           inner ? inner : "unset");
    return 0;
}
