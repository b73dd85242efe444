/* arxtune's NCCL tuner plugin: per collective and size, the algorithm, protocol and channel
 * count a calibration chose, handed to NCCL itself (NCCL_TUNER_PLUGIN=path/to/this.so).
 *
 * The policy is a CSV file named by NCCL_TUNER_CONFIG_FILE, in the column format of NCCL's
 * example plugin (`arxtune calibrate --export nccl-tuner` writes it):
 *
 *   collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
 *
 * Both byte bounds are inclusive; -1 is a wildcard everywhere (max_bytes -1: no upper bound;
 * algorithm or protocol -1: NCCL picks that one itself; channels -1: NCCL's count). The first
 * line that matches a call decides it; '#' starts a comment line.
 *
 * For a call that matches, the chosen (algorithm, protocol) entry of NCCL's cost table is set to
 * zero, so NCCL's own pick (the cheapest entry) lands on it, and the channel count is set. A call
 * that matches nothing, or whose chosen entry NCCL marked unusable, keeps NCCL's choice. A file
 * that cannot be read or parsed, or that names an unknown collective, algorithm or protocol, is
 * dropped whole with one warning through NCCL's logger: NCCL then chooses every call. Nothing
 * here fails a communicator or a call.
 *
 * Interface versions exported: ncclTunerPlugin_v3 .. _v7, NCCL's cost-table interfaces (v3 came
 * with NCCL 2.22). v4 added regBuff to getCollInfo (v3 calls match rules whose regBuff is -1),
 * v5 commId, NVLink domain info and NCCL's tuning constants to init (unused here), v6 an optional
 * chunk-size hook (left as NCCL computes it), v7 larger constants. The declarations below are
 * written from NCCL's headers (src/include/plugin/tuner/tuner_v3.h .. v7.h).
 */

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nccl_result;  /* ncclResult_t: 0 is ncclSuccess */
typedef void (*nccl_logger)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

enum { LOG_WARN = 2, LOG_INFO = 3 };    /* ncclDebugLogLevel */
enum { LOG_TUNING = 64 };               /* NCCL_TUNING subsystem flag */
#define COST_IGNORE (-1.0f)             /* NCCL_ALGO_PROTO_IGNORE: an entry NCCL will not use */
#define MAX_FILE_BYTES (1 << 20)
#define MAX_LINE 512
#define MAX_FIELDS 10
#define MAX_CHANNELS 64
#define ANY (-1)

/* Names in NCCL's index order (ncclFunc_t, NCCL_ALGO_*, NCCL_PROTO_*), compared without case or '_'. */
static const char* const COLLECTIVES[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* const ALGORITHMS[] = {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"};
static const char* const PROTOCOLS[] = {"ll", "ll128", "simple"};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

typedef struct {
  int collective, algorithm, protocol, channels, nodes, ranks, pipe_ops, reg_buff;
  long long min_bytes, max_bytes;  /* max_bytes ANY: no upper bound */
  int line, warned;                /* where it came from; whether its "cannot apply" line was logged */
} rule;

typedef struct {
  size_t ranks, nodes;
  nccl_logger log;
  char path[512];
  int count;
  rule* rules;
} context;

static void say(const context* ctx, int level, const char* fmt, ...) {
  char text[768];
  va_list args;
  if (!ctx || !ctx->log) return;
  va_start(args, fmt);
  vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  ctx->log(level, LOG_TUNING, __FILE__, __LINE__, "%s", text);  /* formatted here: the logger sees one string */
}

static char* trim(char* s) {
  char* end;
  while (isspace((unsigned char)*s)) s++;
  end = s + strlen(s);
  while (end > s && isspace((unsigned char)end[-1])) *--end = '\0';
  return s;
}

/* Index of `name` in `names` ignoring case and '_', ANY for "-1" when `wildcard`, else -2. */
static int lookup(const char* name, const char* const* names, int n, int wildcard) {
  char folded[64];
  int k = 0;
  if (wildcard && strcmp(name, "-1") == 0) return ANY;
  for (; *name && k < (int)sizeof(folded) - 1; name++)
    if (*name != '_') folded[k++] = (char)tolower((unsigned char)*name);
  folded[k] = '\0';
  for (int i = 0; i < n; i++)
    if (strcmp(folded, names[i]) == 0) return i;
  return -2;
}

/* A whole decimal number in [lo, hi], or ANY; 0 when it is not one. */
static int number(const char* text, long long lo, long long hi, long long* out) {
  char* end;
  long long v;
  if (!*text) return 0;
  errno = 0;
  v = strtoll(text, &end, 10);
  if (errno || *end || ((v < lo || v > hi) && v != ANY)) return 0;
  *out = v;
  return 1;
}

/* One CSV line into `r`; NULL when it is good, else what is wrong with it. */
static const char* parse_line(char* line, rule* r) {
  char* fields[MAX_FIELDS];
  int n = 0;
  long long v[8];
  char* cursor = line;
  for (;;) {
    char* comma = strchr(cursor, ',');
    if (n == MAX_FIELDS) return "more than 10 fields";
    fields[n++] = trim(cursor);
    if (!comma) break;
    *comma = '\0';
    cursor = comma + 1;
  }
  if (n < 8) return "fewer than 8 fields (collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks)";
  if ((r->collective = lookup(fields[0], COLLECTIVES, COUNT(COLLECTIVES), 0)) < 0) return "unknown collective";
  if ((r->algorithm = lookup(fields[3], ALGORITHMS, COUNT(ALGORITHMS), 1)) == -2) return "unknown algorithm";
  if ((r->protocol = lookup(fields[4], PROTOCOLS, COUNT(PROTOCOLS), 1)) == -2) return "unknown protocol";
  if (!number(fields[1], 0, INT64_MAX, &v[0]) || v[0] == ANY) return "min_bytes is not a byte count";
  if (!number(fields[2], 0, INT64_MAX, &v[1])) return "max_bytes is not a byte count or -1";
  if (v[1] != ANY && v[1] < v[0]) return "max_bytes is below min_bytes";
  if (!number(fields[5], 1, MAX_CHANNELS, &v[2])) return "channels is not -1 or 1..64";
  if (!number(fields[6], 1, 1 << 20, &v[3]) || !number(fields[7], 1, 1 << 24, &v[4])) return "nNodes or nRanks is not -1 or a count";
  v[5] = v[6] = ANY;
  if (n > 8 && !number(fields[8], 1, 1 << 20, &v[5])) return "numPipeOps is not -1 or a count";
  if (n > 9 && !number(fields[9], 0, 1, &v[6])) return "regBuff is not -1, 0 or 1";
  r->min_bytes = v[0];
  r->max_bytes = v[1];
  r->channels = (int)v[2];
  r->nodes = (int)v[3];
  r->ranks = (int)v[4];
  r->pipe_ops = (int)v[5];
  r->reg_buff = (int)v[6];
  r->warned = 0;
  return NULL;
}

/* Read every rule of `path` into ctx; on any problem keep none and say where, in one line. */
static void load(context* ctx, const char* path) {
  FILE* file = fopen(path, "r");
  char* text;
  size_t size;
  int line_no = 0, capacity = 0;
  const char* problem = NULL;
  snprintf(ctx->path, sizeof(ctx->path), "%s", path);
  if (!file) {
    say(ctx, LOG_WARN, "arxtune tuner: cannot open %s (%s); NCCL chooses every call", path, strerror(errno));
    return;
  }
  text = malloc(MAX_FILE_BYTES + 1);
  size = text ? fread(text, 1, MAX_FILE_BYTES + 1, file) : 0;
  fclose(file);
  if (!text || size > MAX_FILE_BYTES) {
    say(ctx, LOG_WARN, "arxtune tuner: %s is %s; NCCL chooses every call", path, text ? "larger than 1 MiB" : "unreadable (no memory)");
    free(text);
    return;
  }
  text[size] = '\0';
  if (memchr(text, '\0', size)) problem = "holds a NUL byte (not a text file)";
  for (char* cursor = text; !problem && *cursor;) {
    char* newline = strchr(cursor, '\n');
    char* line;
    line_no++;
    if (newline) *newline = '\0';
    if (strlen(cursor) >= MAX_LINE) {
      problem = "line longer than 511 characters";
      break;
    }
    line = trim(cursor);
    cursor = newline ? newline + 1 : cursor + strlen(cursor);
    if (!*line || *line == '#') continue;
    if (ctx->count == capacity) {
      rule* grown = realloc(ctx->rules, sizeof(rule) * (size_t)(capacity = capacity ? 2 * capacity : 16));
      if (!grown) {
        problem = "too large (no memory)";
        break;
      }
      ctx->rules = grown;
    }
    problem = parse_line(line, &ctx->rules[ctx->count]);
    ctx->rules[ctx->count].line = line_no;
    if (!problem) ctx->count++;
  }
  free(text);
  if (problem) {
    say(ctx, LOG_WARN, "arxtune tuner: %s:%d: %s; the file is ignored and NCCL chooses every call", path, line_no, problem);
    free(ctx->rules);
    ctx->rules = NULL;
    ctx->count = 0;
    return;
  }
  say(ctx, LOG_INFO, "arxtune tuner: %d rules from %s (%zu ranks, %zu nodes)", ctx->count, path, ctx->ranks, ctx->nodes);
}

/* NCCL_PROTO / NCCL_ALGO as this communicator is created: NCCL reads them a step after this init (its
 * tuning model), and entries they disable are unusable to every rule. Said so that a rule NCCL cannot
 * follow is explained, and so that the environment a communicator was made in shows in NCCL's log
 * even on one rank, where NCCL itself skips its tuning model and never reads them. */
static void say_environment(const context* ctx) {
  const char* proto = getenv("NCCL_PROTO");
  const char* algo = getenv("NCCL_ALGO");
  if ((proto && *proto) || (algo && *algo))
    say(ctx, LOG_INFO, "arxtune tuner: communicator of %zu ranks created with NCCL_PROTO=%s NCCL_ALGO=%s", ctx->ranks,
        proto && *proto ? proto : "(unset)", algo && *algo ? algo : "(unset)");
}

static nccl_result start(size_t ranks, size_t nodes, nccl_logger log, void** out) {
  context* ctx = calloc(1, sizeof(context));
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  *out = ctx;  /* NULL when out of memory: getCollInfo then leaves every call to NCCL */
  if (!ctx) return 0;
  ctx->ranks = ranks;
  ctx->nodes = nodes;
  ctx->log = log;
  if (path && *path) load(ctx, path);
  else say(ctx, LOG_WARN, "arxtune tuner: NCCL_TUNER_CONFIG_FILE is not set; NCCL chooses every call");
  say_environment(ctx);
  return 0;
}

static int matches(const rule* r, const context* ctx, int collective, size_t bytes, int pipe_ops, int reg_buff) {
  return r->collective == collective && (long long)bytes >= r->min_bytes && (r->max_bytes == ANY || (long long)bytes <= r->max_bytes)
         && (r->nodes == ANY || (size_t)r->nodes == ctx->nodes) && (r->ranks == ANY || (size_t)r->ranks == ctx->ranks)
         && (r->pipe_ops == ANY || r->pipe_ops == pipe_ops) && (r->reg_buff == ANY || r->reg_buff == reg_buff);
}

/* The usable entry of `cost` (algos x protos) that the rule names, the cheapest where it leaves one
 * of the two to NCCL; -1 when there is none. */
static int chosen_entry(const rule* r, const float* cost, int algos, int protos) {
  int best = -1;
  for (int a = 0; a < algos; a++) {
    for (int p = 0; p < protos; p++) {
      int at = a * protos + p;
      if ((r->algorithm != ANY && r->algorithm != a) || (r->protocol != ANY && r->protocol != p)) continue;
      if (cost[at] != COST_IGNORE && cost[at] >= 0 && (best < 0 || cost[at] < cost[best])) best = at;
    }
  }
  return best;
}

static nccl_result get_coll_info(void* context_, int collective, size_t bytes, int pipe_ops, float** table, int algos,
                                 int protos, int reg_buff, int* channels) {
  context* ctx = context_;
  float* cost = (float*)table;  /* NCCL passes its float[algos][protos] cast to float** */
  rule* r = NULL;
  int at = -1;
  if (!ctx) return 0;
  for (int i = 0; i < ctx->count && !r; i++)
    if (matches(&ctx->rules[i], ctx, collective, bytes, pipe_ops, reg_buff)) r = &ctx->rules[i];
  if (!r) return 0;  /* the file says nothing: NCCL's choice */
  if (r->algorithm != ANY || r->protocol != ANY) {
    at = (r->algorithm < algos && r->protocol < protos) ? chosen_entry(r, cost, algos, protos) : -1;
    if (at < 0) {
      if (!r->warned)
        say(ctx, LOG_INFO, "arxtune tuner: %s:%d names %s/%s, which this NCCL does not offer for %s here; NCCL chooses",
            ctx->path, r->line, r->algorithm == ANY ? "any" : ALGORITHMS[r->algorithm],
            r->protocol == ANY ? "any" : PROTOCOLS[r->protocol], COLLECTIVES[collective]);
      r->warned = 1;
      return 0;
    }
    cost[at] = 0.0f;
  }
  if (r->channels != ANY) *channels = r->channels;
  say(ctx, LOG_INFO, "arxtune tuner: %s %zu bytes -> %s/%s, %d channels (%s:%d)", COLLECTIVES[collective], bytes,
      at < 0 ? "nccl's" : ALGORITHMS[at / protos], at < 0 ? "nccl's" : PROTOCOLS[at % protos], r->channels, ctx->path, r->line);
  return 0;
}

/* v3: no regBuff argument; only rules that match either registration apply. */
static nccl_result get_coll_info_v3(void* context_, int collective, size_t bytes, int pipe_ops, float** table, int algos,
                                    int protos, int* channels) {
  return get_coll_info(context_, collective, bytes, pipe_ops, table, algos, protos, ANY, channels);
}

static nccl_result stop(void* context_) {
  context* ctx = context_;
  if (ctx) free(ctx->rules);
  free(ctx);
  return 0;
}

static nccl_result init_v4(size_t ranks, size_t nodes, nccl_logger log, void** ctx) { return start(ranks, nodes, log, ctx); }

static nccl_result init_v5(void** ctx, uint64_t comm_id, size_t ranks, size_t nodes, nccl_logger log, void* nvl_domains,
                           void* constants) {
  (void)comm_id, (void)nvl_domains, (void)constants;  /* NCCL's model constants are left as they are */
  return start(ranks, nodes, log, ctx);
}

static nccl_result chunk_size(void* ctx, int collective, size_t bytes, int algorithm, int protocol, int channels, size_t* size) {
  (void)ctx, (void)collective, (void)bytes, (void)algorithm, (void)protocol, (void)channels, (void)size;
  return 0;  /* NCCL's own chunk size */
}

typedef nccl_result (*coll_info_fn)(void*, int, size_t, int, float**, int, int, int, int*);

typedef struct {
  const char* name;
  nccl_result (*init)(size_t, size_t, nccl_logger, void**);
  nccl_result (*get_coll_info)(void*, int, size_t, int, float**, int, int, int*);
  nccl_result (*destroy)(void*);
} tuner_v3;

typedef struct {
  const char* name;
  nccl_result (*init)(size_t, size_t, nccl_logger, void**);
  coll_info_fn get_coll_info;
  nccl_result (*destroy)(void*);
} tuner_v4;

typedef struct {
  const char* name;
  nccl_result (*init)(void**, uint64_t, size_t, size_t, nccl_logger, void*, void*);
  coll_info_fn get_coll_info;
  nccl_result (*finalize)(void*);
} tuner_v5;

typedef struct {  /* v6 and v7 (v7 only enlarges the constants, which this plugin does not touch) */
  const char* name;
  nccl_result (*init)(void**, uint64_t, size_t, size_t, nccl_logger, void*, void*);
  coll_info_fn get_coll_info;
  nccl_result (*finalize)(void*);
  nccl_result (*get_chunk_size)(void*, int, size_t, int, int, int, size_t*);
} tuner_v6;

#define NAME "arxtune"
const tuner_v3 ncclTunerPlugin_v3 = {NAME, init_v4, get_coll_info_v3, stop};
const tuner_v4 ncclTunerPlugin_v4 = {NAME, init_v4, get_coll_info, stop};
const tuner_v5 ncclTunerPlugin_v5 = {NAME, init_v5, get_coll_info, stop};
const tuner_v6 ncclTunerPlugin_v6 = {NAME, init_v5, get_coll_info, stop, chunk_size};
const tuner_v6 ncclTunerPlugin_v7 = {NAME, init_v5, get_coll_info, stop, chunk_size};
