/* test_sched.c - the scheduler's decisions on scripted arrivals, with a
 * pretend KV cache of T blocks of B tokens (no sharing): decode first, the
 * token budget and chunked prefill, max_num_seqs, the admission watermark,
 * preemption of the newest and its recompute first, a request too large for
 * the cache ending alone, blocks held by waiting requests (a KV stream's)
 * given back before anyone ends, static batches, and whole simulated jobs. */
#include "sched.h"
#include "unit.h"

#define B 4 /* tokens per block */

typedef struct fake_req {
    kvp_sched_req r;
    uint32_t prompt, out; /* prompt tokens, tokens to generate */
    uint32_t gen;         /* generated so far */
    int started, done;
    uint32_t prefix;      /* tokens a start reuses (a prefix cache hit) */
    struct fake_req *shares; /* a request whose first `shared` tokens are this one's too (ahead) */
    uint32_t shared;
    uint32_t held;        /* blocks it holds while waiting (a KV stream's sequence) */
    uint32_t n_dropped;   /* times those were given back (drop_held) */
} fake_req;

typedef struct fake_kv {
    uint32_t total;        /* blocks in the pool */
    fake_req *reqs;
    uint32_t n;
    uint32_t n_start, n_release;
} fake_kv;

static uint32_t blocks_of(uint32_t tokens) { return (tokens + B - 1) / B; }

static uint32_t fk_n_free(void *ctx)
{
    fake_kv *k = ctx;
    uint32_t held = 0;
    for (uint32_t i = 0; i < k->n; i++)
        held += k->reqs[i].started ? blocks_of(k->reqs[i].r.n_computed) : k->reqs[i].held;
    return held > k->total ? 0 : k->total - held;
}

static uint32_t fk_needed(void *ctx, const kvp_sched_req *r, uint32_t n)
{
    (void)ctx;
    return blocks_of(r->n_computed + n) - blocks_of(r->n_computed);
}

static int fk_start(void *ctx, kvp_sched_req *r, kvp_err *err)
{
    (void)err;
    fake_kv *k = ctx;
    fake_req *f = r->user;
    k->n_start++;
    f->started = 1;
    f->prefix += f->held * B; /* its own blocks become its first tokens' */
    f->held = 0;
    return (int)f->prefix;
}

static int fk_drop_held(void *ctx, kvp_sched_req *w)
{
    (void)ctx;
    fake_req *f = w->user;
    CHECK(w->state == KVP_SCHED_WAITING && !f->started);
    if (!f->held)
        return 0;
    f->held = 0;
    f->n_dropped++;
    return 1;
}

static void fk_release(void *ctx, kvp_sched_req *r)
{
    fake_kv *k = ctx;
    fake_req *f = r->user;
    k->n_release++;
    f->started = 0;
}

/* The prefix cache as batch.c's kv_ahead sees it: w shares its first
 * `shared` tokens with one other request, which caches them as it
 * computes them; a start after that reuses them (fk_start: prefix). */
static uint32_t fk_ahead(void *ctx, const kvp_sched_req *w, const kvp_sched_req *r)
{
    (void)ctx;
    const fake_req *fw = w->user;
    if (fw->shares != r->user || r->n_computed >= fw->shared || w->n_computed >= fw->shared)
        return 0;
    return fw->shared - w->n_computed;
}

static kvp_sched *make_kv(fake_kv *k, fake_req *reqs, uint32_t n, uint32_t total, const kvp_sched_opts *o,
                          int with_ahead);

static kvp_sched *make(fake_kv *k, fake_req *reqs, uint32_t n, uint32_t total, const kvp_sched_opts *o)
{
    return make_kv(k, reqs, n, total, o, 0);
}

static kvp_sched *make_kv(fake_kv *k, fake_req *reqs, uint32_t n, uint32_t total, const kvp_sched_opts *o,
                          int with_ahead)
{
    memset(k, 0, sizeof *k);
    k->total = total;
    k->reqs = reqs;
    k->n = n;
    for (uint32_t i = 0; i < n; i++) {
        reqs[i].r.user = &reqs[i];
        reqs[i].r.n_tokens = reqs[i].prompt;
    }
    kvp_sched_kv kv = {.ctx = k, .n_free = fk_n_free, .blocks_needed = fk_needed, .start = fk_start,
                       .release = fk_release, .ahead = with_ahead ? fk_ahead : NULL, .drop_held = fk_drop_held};
    kvp_sched *s = NULL;
    kvp_err err = {0};
    CHECK(kvp_sched_create(&s, o, &kv, &err) == 0);
    return s;
}

/* What the generation loop does after a step: a request whose step reached
 * its end gets a token, or finishes when it has all of them. */
static void after_step(kvp_sched *s, const kvp_sched_plan *p)
{
    kvp_sched_commit(s, p);
    for (uint32_t i = 0; i < p->n_items; i++) {
        kvp_sched_req *r = p->items[i].r;
        fake_req *f = r->user;
        if (r->n_computed < r->n_tokens)
            continue;
        /* recomputing a preempted request's tokens samples nothing new */
        if (r->n_tokens < f->prompt + f->gen)
            continue;
        f->gen++;
        if (f->gen >= f->out) {
            f->done = 1;
            kvp_sched_finish(s, r);
        } else {
            r->n_tokens++;
        }
    }
}

static fake_req *item_req(const kvp_sched_plan *p, uint32_t i) { return p->items[i].r->user; }

static void test_decode_first_and_chunks(void)
{
    fake_req q[4] = {{.prompt = 3, .out = 10}, {.prompt = 3, .out = 10}, {.prompt = 3, .out = 10},
                     {.prompt = 100, .out = 2}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 8, .max_batched_tokens = 16};
    kvp_sched *s = make(&k, q, 4, 1000, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    for (int i = 0; i < 3; i++)
        kvp_sched_add(s, &q[i].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 3);
    CHECK_EQ_U64(p.n_tokens, 9);
    after_step(s, &p);
    kvp_sched_add(s, &q[3].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    /* three decode tokens first, then the long prompt gets what is left */
    CHECK_EQ_U64(p.n_items, 4);
    CHECK(item_req(&p, 0) == &q[0] && p.items[0].n == 1);
    CHECK(item_req(&p, 2) == &q[2] && p.items[2].n == 1);
    CHECK(item_req(&p, 3) == &q[3] && p.items[3].n == 13);
    CHECK_EQ_U64(p.n_tokens, 16);
    after_step(s, &p);
    CHECK_EQ_U64(q[3].r.n_computed, 13);
    CHECK_EQ_U64(q[3].gen, 0);
    /* the chunked prompt continues next step, still after the decodes */
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK(item_req(&p, 3) == &q[3] && p.items[3].n == 13);
    kvp_sched_free(s);
}

/* lookahead: each decode step keeps room for its guesses (a fixed draft
 * length) before a prompt chunk takes the budget; a decode step is still
 * planned its one token, and the room stops at the budget's end. */
static void test_lookahead(void)
{
    fake_req q[4] = {{.prompt = 3, .out = 10}, {.prompt = 3, .out = 10}, {.prompt = 3, .out = 10},
                     {.prompt = 100, .out = 2}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 8, .max_batched_tokens = 16, .lookahead = 3};
    kvp_sched *s = make(&k, q, 4, 1000, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    for (int i = 0; i < 3; i++)
        kvp_sched_add(s, &q[i].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0); /* three prompts of 3: no decode step yet */
    CHECK_EQ_U64(p.n_tokens, 9);
    after_step(s, &p);
    kvp_sched_add(s, &q[3].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    /* 3 decodes x (1 + 3) = 12 of 16: the prompt's chunk is 4, not 13 */
    CHECK_EQ_U64(p.n_items, 4);
    CHECK(p.items[0].n == 1 && p.items[1].n == 1 && p.items[2].n == 1);
    CHECK(item_req(&p, 3) == &q[3] && p.items[3].n == 4);
    CHECK_EQ_U64(p.n_tokens, 7);
    kvp_sched_free(s);
    /* a budget smaller than the decodes' room: each still gets its token
     * (9 - 3 of the 24 kept) */
    fake_req r[3] = {{.prompt = 3, .out = 10}, {.prompt = 3, .out = 10}, {.prompt = 3, .out = 10}};
    o.max_batched_tokens = 9, o.lookahead = 8;
    s = make(&k, r, 3, 1000, &o);
    for (int i = 0; i < 3; i++)
        kvp_sched_add(s, &r[i].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    after_step(s, &p);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 3);
    CHECK_EQ_U64(p.n_tokens, 3);
    kvp_sched_free(s);
}

static void test_max_num_seqs(void)
{
    fake_req q[5];
    memset(q, 0, sizeof q);
    for (int i = 0; i < 5; i++)
        q[i].prompt = 2, q[i].out = 3;
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 2, .max_batched_tokens = 64};
    kvp_sched *s = make(&k, q, 5, 1000, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    for (int i = 0; i < 5; i++)
        kvp_sched_add(s, &q[i].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 2);
    CHECK_EQ_U64(kvp_sched_n_running(s), 2);
    CHECK_EQ_U64(kvp_sched_n_waiting(s), 3);
    /* a seat frees only when one finishes, and goes to the next in order */
    after_step(s, &p);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 2);
    after_step(s, &p);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    after_step(s, &p);
    CHECK(q[0].done && q[1].done);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK(item_req(&p, 0) == &q[2] && item_req(&p, 1) == &q[3]);
    kvp_sched_free(s);
}

static void test_watermark(void)
{
    fake_req q[2] = {{.prompt = 8, .out = 50}, {.prompt = 8, .out = 5}};
    fake_kv k;
    /* 6 blocks: the first takes 2; the second's 2 would leave 2 < watermark 3 */
    kvp_sched_opts o = {.max_num_seqs = 4, .max_batched_tokens = 64, .watermark_blocks = 3};
    kvp_sched *s = make(&k, q, 2, 6, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    kvp_sched_add(s, &q[0].r, &err);
    kvp_sched_add(s, &q[1].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 1);
    CHECK_EQ_U64(kvp_sched_n_waiting(s), 1);
    CHECK(!q[1].started); /* the admission that did not fit gave its sequence back */
    kvp_sched_free(s);

    /* without the watermark both go */
    o.watermark_blocks = 0;
    s = make(&k, q, 2, 6, &o);
    kvp_sched_add(s, &q[0].r, &err);
    kvp_sched_add(s, &q[1].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 2);
    kvp_sched_free(s);
}

static void test_preempt_newest_and_recompute_first(void)
{
    /* 4 blocks of 4 tokens: two requests of 6 prompt tokens (2 blocks each)
     * fill the pool; the first to need a third block preempts the newest */
    fake_req q[3] = {{.prompt = 6, .out = 6}, {.prompt = 6, .out = 6}, {.prompt = 2, .out = 1}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 4, .max_batched_tokens = 64};
    kvp_sched *s = make(&k, q, 3, 4, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    kvp_sched_add(s, &q[0].r, &err);
    kvp_sched_add(s, &q[1].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 2);
    after_step(s, &p); /* 6 computed each, 7 tokens known */
    kvp_sched_add(s, &q[2].r, &err); /* arrives later: must wait behind the preempted */
    CHECK(kvp_sched_step(s, &p, &err) == 0); /* tokens 7: still within 2 blocks */
    CHECK_EQ_U64(p.n_items, 2);
    CHECK_EQ_U64(p.n_preempted, 0);
    after_step(s, &p);
    CHECK(kvp_sched_step(s, &p, &err) == 0); /* token 8 fills block 2: fine */
    after_step(s, &p);
    CHECK(kvp_sched_step(s, &p, &err) == 0); /* token 9 needs block 3 for both: q[1] goes */
    CHECK_EQ_U64(p.n_preempted, 1);
    CHECK_EQ_U64(p.n_items, 1);
    CHECK(item_req(&p, 0) == &q[0]);
    CHECK_EQ_U64(q[1].r.n_computed, 0);
    CHECK_EQ_U64(q[1].r.n_preempted, 1);
    CHECK(q[1].r.state == KVP_SCHED_WAITING);
    CHECK(!q[1].started);
    CHECK_EQ_U64(kvp_sched_n_preemptions(s), 1);
    after_step(s, &p);
    while (!q[0].done) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        after_step(s, &p);
    }
    /* the preempted request comes back before the later arrival, and its
     * recompute covers its prompt and the tokens it had generated */
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK(p.n_items >= 1 && item_req(&p, 0) == &q[1]);
    CHECK_EQ_U64(p.items[0].n, q[1].prompt + q[1].gen);
    uint32_t gen_before = q[1].gen;
    after_step(s, &p);
    CHECK_EQ_U64(q[1].gen, gen_before + 1); /* the recompute's last token samples the next */
    for (int guard = 0; guard < 100 && !(q[1].done && q[2].done); guard++) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        after_step(s, &p);
    }
    CHECK(q[1].done && q[2].done);
    CHECK_EQ_U64(q[1].gen, 6);
    kvp_sched_free(s);
}

/* A step that preempts admits nobody, not even the preempted request whose
 * first chunk would fit in what it freed: it would only be preempted again. */
static void test_no_admission_when_preempting(void)
{
    fake_req q[2] = {{.prompt = 4, .out = 12}, {.prompt = 4, .out = 12}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 4, .max_batched_tokens = 5};
    kvp_sched *s = make(&k, q, 2, 6, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    kvp_sched_add(s, &q[0].r, &err);
    kvp_sched_add(s, &q[1].r, &err);
    int preempting_steps = 0;
    for (int guard = 0; guard < 40 && !preempting_steps; guard++) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        if (p.n_preempted) {
            preempting_steps++;
            CHECK_EQ_U64(p.n_items, 1);
            CHECK(item_req(&p, 0) == &q[0]);
            CHECK(q[1].r.state == KVP_SCHED_WAITING && !q[1].started);
        }
        after_step(s, &p);
    }
    CHECK_EQ_U64(preempting_steps, 1);
    kvp_sched_free(s);
}

static void test_too_large_alone(void)
{
    /* 3 blocks = 12 tokens; q[0] wants 8 + 20: it ends for memory, q[1] completes */
    fake_req q[2] = {{.prompt = 8, .out = 20}, {.prompt = 2, .out = 2}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 4, .max_batched_tokens = 64};
    kvp_sched *s = make(&k, q, 2, 3, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    kvp_sched_add(s, &q[0].r, &err);
    kvp_sched_add(s, &q[1].r, &err);
    int ended = 0;
    for (int guard = 0; guard < 200 && (kvp_sched_n_running(s) || kvp_sched_n_waiting(s)); guard++) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        for (uint32_t i = 0; i < p.n_ended; i++) {
            CHECK(p.ended[i] == &q[0].r);
            CHECK(p.ended[i]->state == KVP_SCHED_KV_MEMORY);
            ended++;
        }
        after_step(s, &p);
    }
    CHECK_EQ_U64(ended, 1);
    CHECK(q[1].done);
    CHECK(!q[0].done && !q[0].started);
    /* a first chunk that cannot fit in an empty cache ends at admission */
    fake_req big[1] = {{.prompt = 40, .out = 1}};
    kvp_sched_free(s);
    o.max_batched_tokens = 64;
    s = make(&k, big, 1, 3, &o);
    kvp_sched_add(s, &big[0].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_ended, 1);
    CHECK_EQ_U64(p.n_items, 0);
    CHECK(!big[0].started);
    CHECK_EQ_U64(kvp_sched_n_waiting(s) + kvp_sched_n_running(s), 0);
    kvp_sched_free(s);
}

/* Waiting requests that arrived with their blocks (a KV stream read
 * ahead) give them back, the last queued first and only as many as needed,
 * before a request that fits the cache alone is ended; then they compute
 * their prompts.  Both where the running request grows and where the first
 * chunk is admitted. */
static void test_held_given_back(void)
{
    /* 3 blocks of 4 tokens; q[0] reaches 4 + 8 - 1 = 11 tokens (3 blocks)
     * while q[1] and q[2] wait holding a block each, one seat */
    fake_req q[3] = {{.prompt = 4, .out = 8}, {.prompt = 4, .out = 2, .held = 1}, {.prompt = 4, .out = 2, .held = 1}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 1, .max_batched_tokens = 64};
    kvp_sched *s = make(&k, q, 3, 3, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    for (int i = 0; i < 3; i++)
        kvp_sched_add(s, &q[i].r, &err);
    int ended = 0, saw_one_dropped = 0;
    for (int guard = 0; guard < 200 && (kvp_sched_n_running(s) || kvp_sched_n_waiting(s)); guard++) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        ended += (int)p.n_ended;
        /* the second block of q[0] came from q[2], the last queued, alone */
        if (q[0].r.n_computed + p.items[0].n == 5 && item_req(&p, 0) == &q[0])
            saw_one_dropped = q[2].n_dropped == 1 && q[1].n_dropped == 0;
        after_step(s, &p);
    }
    CHECK_EQ_U64(ended, 0);
    CHECK(saw_one_dropped);
    CHECK(q[0].done && q[1].done && q[2].done);
    CHECK_EQ_U64(q[1].n_dropped + q[2].n_dropped, 2);
    CHECK_EQ_U64(kvp_sched_n_preemptions(s), 2);
    kvp_sched_free(s);
    /* admission: q[0]'s 12-token prompt needs all 3 blocks, q[1] and q[2]
     * hold 2 of them; alone, it takes them back rather than end */
    fake_req a[3] = {{.prompt = 12, .out = 1}, {.prompt = 4, .out = 1, .held = 1}, {.prompt = 4, .out = 1, .held = 1}};
    s = make(&k, a, 3, 3, &o);
    for (int i = 0; i < 3; i++)
        kvp_sched_add(s, &a[i].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_ended, 0);
    CHECK_EQ_U64(p.n_items, 1);
    CHECK(item_req(&p, 0) == &a[0]);
    CHECK_EQ_U64(a[1].n_dropped + a[2].n_dropped, 2);
    kvp_sched_free(s);
    /* a request larger than the cache still ends, after taking back what
     * waiting ones held, and they complete */
    fake_req b[2] = {{.prompt = 16, .out = 1}, {.prompt = 4, .out = 1, .held = 1}};
    s = make(&k, b, 2, 3, &o);
    for (int i = 0; i < 2; i++)
        kvp_sched_add(s, &b[i].r, &err);
    ended = 0;
    for (int guard = 0; guard < 50 && (kvp_sched_n_running(s) || kvp_sched_n_waiting(s)); guard++) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        for (uint32_t i = 0; i < p.n_ended; i++)
            ended += p.ended[i] == &b[0].r;
        after_step(s, &p);
    }
    CHECK_EQ_U64(ended, 1);
    CHECK(b[1].done);
    kvp_sched_free(s);
}

static void test_prefix_reuse(void)
{
    fake_req q[1] = {{.prompt = 20, .out = 1, .prefix = 16}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 4, .max_batched_tokens = 64};
    kvp_sched *s = make(&k, q, 1, 100, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    kvp_sched_add(s, &q[0].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 1);
    CHECK_EQ_U64(p.items[0].n, 4); /* 16 of 20 came from the cache */
    kvp_sched_free(s);
}

/* A request sharing a prompt prefix with a running one waits while that
 * one computes the shared blocks, then starts on them from the cache; the
 * requests behind it wait too (first come, first served).  Without `ahead`
 * it starts in the same step and computes them again. */
static void test_wait_for_prefix(void)
{
    for (int with = 0; with < 2; with++) {
        fake_req q[3] = {{.prompt = 40, .out = 2}, {.prompt = 40, .out = 2}, {.prompt = 8, .out = 2}};
        q[1].shares = &q[0], q[1].shared = 32;
        fake_kv k;
        kvp_sched_opts o = {.max_num_seqs = 4, .max_batched_tokens = 48};
        kvp_sched *s = make_kv(&k, q, 3, 100, &o, with);
        kvp_err err = {0};
        kvp_sched_plan p;
        for (int i = 0; i < 3; i++)
            kvp_sched_add(s, &q[i].r, &err);
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        CHECK(item_req(&p, 0) == &q[0] && p.items[0].n == 40);
        if (!with) { /* q[1] starts beside q[0], on no cached block */
            CHECK_EQ_U64(p.n_items, 2);
            CHECK(item_req(&p, 1) == &q[1] && p.items[1].n == 8 && q[1].r.n_computed == 0);
            kvp_sched_free(s);
            continue;
        }
        CHECK_EQ_U64(p.n_items, 1); /* q[1] waits, and q[2] behind it */
        CHECK(!q[1].started && !q[2].started);
        after_step(s, &p);
        q[1].prefix = 32; /* the cache now holds q[0]'s blocks for q[1] */
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        CHECK_EQ_U64(p.n_items, 3);
        CHECK(item_req(&p, 0) == &q[0] && p.items[0].n == 1);
        CHECK(item_req(&p, 1) == &q[1] && p.items[1].n == 8 && q[1].r.n_computed == 32);
        CHECK(item_req(&p, 2) == &q[2] && p.items[2].n == 8);
        kvp_sched_free(s);
    }
    /* a static batch is admitted whole, shared prefix or not */
    fake_req q[2] = {{.prompt = 40, .out = 2}, {.prompt = 40, .out = 2}};
    q[1].shares = &q[0], q[1].shared = 32;
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 2, .max_batched_tokens = 48, .static_batch = 1};
    kvp_sched *s = make_kv(&k, q, 2, 100, &o, 1);
    kvp_err err = {0};
    kvp_sched_plan p;
    kvp_sched_add(s, &q[0].r, &err);
    kvp_sched_add(s, &q[1].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK(q[0].started && q[1].started);
    kvp_sched_free(s);
}

static void test_static_batches(void)
{
    fake_req q[4] = {{.prompt = 2, .out = 1}, {.prompt = 2, .out = 5}, {.prompt = 2, .out = 1},
                     {.prompt = 2, .out = 1}};
    fake_kv k;
    kvp_sched_opts o = {.max_num_seqs = 2, .max_batched_tokens = 64, .static_batch = 1};
    kvp_sched *s = make(&k, q, 4, 100, &o);
    kvp_err err = {0};
    kvp_sched_plan p;
    for (int i = 0; i < 4; i++)
        kvp_sched_add(s, &q[i].r, &err);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 2);
    after_step(s, &p);
    CHECK(q[0].done && !q[1].done);
    /* q[0]'s seat stays empty until q[1], the longest of the batch, ends */
    int steps = 0;
    while (!q[1].done) {
        CHECK(kvp_sched_step(s, &p, &err) == 0);
        CHECK_EQ_U64(p.n_items, 1);
        after_step(s, &p);
        steps++;
    }
    CHECK_EQ_U64(steps, 4);
    CHECK(kvp_sched_step(s, &p, &err) == 0);
    CHECK_EQ_U64(p.n_items, 2);
    CHECK(item_req(&p, 0) == &q[2] && item_req(&p, 1) == &q[3]);
    kvp_sched_free(s);
}

/* Whole jobs on random arrivals: every request finishes with all its tokens
 * or ends for memory only when it alone exceeds the cache; a step never
 * exceeds its budget, seats or blocks. */
static void test_simulated_jobs(void)
{
    uint64_t seed = 12345;
    for (int job = 0; job < 40; job++) {
        enum { N = 60 };
        fake_req q[N];
        memset(q, 0, sizeof q);
        uint32_t total = 8 + (uint32_t)(job * 7 % 40);
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            q[i].prompt = 1 + (uint32_t)(seed >> 33) % 40;
            q[i].out = 1 + (uint32_t)(seed >> 45) % 30;
        }
        fake_kv k;
        kvp_sched_opts o = {.max_num_seqs = 1 + (uint32_t)job % 9, .max_batched_tokens = 8 + (uint32_t)job * 3,
                            .watermark_blocks = (uint32_t)job % 3, .static_batch = job % 5 == 4};
        kvp_sched *s = make(&k, q, N, total, &o);
        kvp_err err = {0};
        kvp_sched_plan p;
        int added = 0, bad_budget = 0, bad_seats = 0, bad_blocks = 0, bad_admit = 0, steps = 0;
        int was_running[N];
        while (steps < 20000) {
            if (added < N && steps % 3 == 0)
                kvp_sched_add(s, &q[added++].r, &err);
            if (added == N && !kvp_sched_n_running(s) && !kvp_sched_n_waiting(s))
                break;
            for (int i = 0; i < N; i++)
                was_running[i] = q[i].r.state == KVP_SCHED_RUNNING;
            if (kvp_sched_step(s, &p, &err) < 0)
                break;
            /* a step that preempted admits nobody (it would only thrash) */
            for (uint32_t i = 0; i < p.n_items && p.n_preempted; i++)
                bad_admit += !was_running[item_req(&p, i) - q];
            bad_budget += p.n_tokens > o.max_batched_tokens;
            bad_seats += kvp_sched_n_running(s) > o.max_num_seqs;
            uint32_t need = 0;
            for (uint32_t i = 0; i < p.n_items; i++)
                need += fk_needed(&k, p.items[i].r, p.items[i].n);
            bad_blocks += need > fk_n_free(&k);
            after_step(s, &p);
            steps++;
        }
        int ok = 1;
        for (int i = 0; i < N; i++) {
            int fits = blocks_of(q[i].prompt + q[i].out - 1) <= total;
            if (fits ? !(q[i].done && q[i].gen == q[i].out) : q[i].r.state != KVP_SCHED_KV_MEMORY)
                ok = 0;
        }
        CHECK_MSG(ok && steps < 20000, "job %d: every request done (or too large), %d steps", job, steps);
        CHECK_MSG(!bad_budget && !bad_seats && !bad_blocks && !bad_admit,
                  "job %d: budget %d seats %d blocks %d admitted while preempting %d", job, bad_budget, bad_seats,
                  bad_blocks, bad_admit);
        CHECK_MSG(k.n_start == k.n_release && fk_n_free(&k) == total, "job %d: every block back", job);
        kvp_sched_free(s);
    }
}

int main(void)
{
    test_decode_first_and_chunks();
    test_lookahead();
    test_max_num_seqs();
    test_watermark();
    test_preempt_newest_and_recompute_first();
    test_no_admission_when_preempting();
    test_too_large_alone();
    test_held_given_back();
    test_prefix_reuse();
    test_wait_for_prefix();
    test_static_batches();
    test_simulated_jobs();
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
