/* safetensors.c - safetensors reader (see safetensors.h). */
#include "safetensors.h"

#include "json.h"
#include "tensor.h"
#include "wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define INDEX_MAX (64u << 20) /* bytes of model.safetensors.index.json */

typedef struct st_dtype {
    const char *name;
    uint32_t size;
    int dtype;
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"F64", 8, KVP_DTYPE_F64},       {"F32", 4, KVP_DTYPE_F32},       {"F16", 2, KVP_DTYPE_F16},
    {"BF16", 2, KVP_DTYPE_BF16},     {"F8_E4M3", 1, KVP_DTYPE_FP8_E4M3}, {"F8_E5M2", 1, KVP_DTYPE_FP8_E5M2},
    {"I8", 1, KVP_DTYPE_I8},         {"U8", 1, KVP_DTYPE_U8},         {"I32", 4, KVP_DTYPE_I32},
    {"U32", 4, KVP_DTYPE_U32},       {"I16", 2, -1},                  {"U16", 2, -1},
    {"I64", 8, -1},                  {"U64", 8, -1},                  {"BOOL", 1, -1},
};

uint32_t kvp_safetensors_dtype_size(const char *name, int *dtype)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0) {
            if (dtype)
                *dtype = st_dtypes[i].dtype;
            return st_dtypes[i].size;
        }
    }
    if (dtype)
        *dtype = -1;
    return 0;
}

uint64_t kvp_safetensors_nelems(const kvp_safetensors_tensor *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        n *= t->shape[d];
    return n;
}

/* ---- one tensor entry of a header ---- */

typedef struct st_ctx {
    const char *file;
    kvp_err *err;
} st_ctx;

static int t_fail(const st_ctx *x, int code, const char *tname, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int t_fail(const st_ctx *x, int code, const char *tname, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kvp_err_set(x->err, code, "%s: tensor \"%.100s\": %s", x->file, tname, what);
}

static int read_shape(const st_ctx *x, const kvp_json *v, kvp_safetensors_tensor *t, uint64_t *nel)
{
    const kvp_json *shape = kvp_json_get(v, "shape");
    if (!shape || shape->type != KVP_JSON_ARRAY)
        return t_fail(x, KVP_EFORMAT, t->name, "shape: missing or not an array");
    if (shape->n > KVP_SAFETENSORS_MAX_DIMS)
        return t_fail(x, KVP_EFORMAT, t->name, "shape: %zu dims, more than %d", shape->n, KVP_SAFETENSORS_MAX_DIMS);
    t->n_dims = (uint32_t)shape->n;
    *nel = 1;
    for (uint32_t d = 0; d < KVP_SAFETENSORS_MAX_DIMS; d++)
        t->shape[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t n;
        if (kvp_json_to_u64(&shape->items[d], &n) != 0)
            return t_fail(x, KVP_EFORMAT, t->name, "shape[%u]: not a non-negative integer", d);
        if (n && *nel > UINT64_MAX / n)
            return t_fail(x, KVP_EFORMAT, t->name, "shape: element count overflows");
        t->shape[d] = n;
        *nel *= n;
    }
    return 0;
}

static int read_tensor(const st_ctx *x, const kvp_safetensors_file *f, const char *name, const kvp_json *v,
                       kvp_safetensors_tensor *t)
{
    t->name = strdup(name);
    if (!t->name)
        return kvp_err_set(x->err, KVP_ENOMEM, "%s: out of memory", x->file);
    if (v->type != KVP_JSON_OBJECT)
        return t_fail(x, KVP_EFORMAT, name, "expected an object, found %s", kvp_json_type_name(v->type));
    const char *dt = kvp_json_get_str(v, "dtype");
    if (!dt)
        return t_fail(x, KVP_EFORMAT, name, "dtype: missing or not a string");
    uint32_t esize = kvp_safetensors_dtype_size(dt, &t->dtype);
    if (!esize)
        return t_fail(x, KVP_EUNSUPPORTED, name, "dtype: \"%.20s\" is not a safetensors dtype we know", dt);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt);
    uint64_t nel = 1;
    int rc = read_shape(x, v, t, &nel);
    if (rc)
        return rc;
    const kvp_json *off = kvp_json_get(v, "data_offsets");
    uint64_t b = 0, e = 0;
    if (!off || off->type != KVP_JSON_ARRAY || off->n != 2 || kvp_json_to_u64(&off->items[0], &b) ||
        kvp_json_to_u64(&off->items[1], &e))
        return t_fail(x, KVP_EFORMAT, name, "data_offsets: expected [begin, end] of non-negative integers");
    uint64_t data_size = f->size - f->data_offset;
    if (b > e || e > data_size)
        return t_fail(x, KVP_ETRUNC, name, "data_offsets: [%" PRIu64 ", %" PRIu64 "] outside the %" PRIu64
                      " bytes of data", b, e, data_size);
    if (nel > UINT64_MAX / esize || e - b != nel * esize)
        return t_fail(x, KVP_EFORMAT, name, "data_offsets: %" PRIu64 " bytes, but %s x %" PRIu64
                      " elements need %" PRIu64, e - b, dt, nel, nel > UINT64_MAX / esize ? 0 : nel * esize);
    t->nbytes = e - b;
    t->offset = f->data_offset + b;
    t->data = f->base + t->offset;
    return 0;
}

/* ---- one file ---- */

static int by_offset(const void *a, const void *b)
{
    const kvp_safetensors_tensor *x = *(const kvp_safetensors_tensor *const *)a;
    const kvp_safetensors_tensor *y = *(const kvp_safetensors_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Two tensors sharing bytes would alias silently: refuse (empty ones aside). */
static int check_overlap(const st_ctx *x, kvp_safetensors_tensor *t, uint64_t n)
{
    if (n < 2)
        return 0;
    const kvp_safetensors_tensor **v = malloc(n * sizeof *v);
    if (!v)
        return kvp_err_set(x->err, KVP_ENOMEM, "%s: out of memory", x->file);
    for (uint64_t i = 0; i < n; i++)
        v[i] = &t[i];
    qsort(v, n, sizeof *v, by_offset);
    int rc = 0;
    uint64_t end = 0;
    const char *prev = NULL;
    for (uint64_t i = 0; i < n && !rc; i++) {
        if (v[i]->nbytes == 0)
            continue;
        if (prev && v[i]->offset < end)
            rc = t_fail(x, KVP_EFORMAT, v[i]->name, "data_offsets: overlaps tensor \"%.100s\"", prev);
        end = v[i]->offset + v[i]->nbytes;
        prev = v[i]->name;
    }
    free(v);
    return rc;
}

static int st_meta(const st_ctx *x, kvp_safetensors *st, const kvp_json *m)
{
    if (m->type != KVP_JSON_OBJECT)
        return kvp_err_set(x->err, KVP_EFORMAT, "%s: __metadata__: expected an object", x->file);
    for (size_t k = 0; k < m->n; k++) {
        const kvp_json *v = &m->items[k];
        if (v->type != KVP_JSON_STRING)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: __metadata__.%.100s: expected a string", x->file, m->keys[k]);
        if (m->key_lens[k] != strlen(m->keys[k]) || m->key_lens[k] == 0)
            return kvp_err_set(x->err, KVP_EFORMAT, "%s: __metadata__: empty key or key with a NUL", x->file);
        if (kvp_meta_set_str(&st->meta, m->keys[k], v->str, v->len))
            return kvp_err_set(x->err, KVP_ENOMEM, "%s: out of memory", x->file);
    }
    return 0;
}

/* Parse the header of files[fi] and append its tensors. */
static int st_parse_file(kvp_safetensors *st, uint32_t fi, kvp_err *err)
{
    kvp_safetensors_file *f = &st->files[fi];
    st_ctx x = {f->path, err};
    if (f->size < 8)
        return kvp_err_set(err, KVP_ETRUNC, "%s: header length: file is %" PRIu64 " bytes, too short", f->path, f->size);
    uint64_t hlen = kvp_le64(f->base);
    /* A safetensors file starts with its header's length: a length's top
     * bytes are zero, never eight printable characters.  Text there (a
     * prompts file, a config given as the model) is not a model file. */
    int text = 1;
    for (int i = 0; i < 8; i++)
        text &= f->base[i] >= 0x20 && f->base[i] < 0x7f;
    if (text && hlen > f->size - 8)
        return kvp_err_set(err, KVP_EFORMAT, "%s: not a model file: neither GGUF, KVP nor safetensors (it begins "
                           "with the text \"%.8s\")", f->path, (const char *)f->base);
    if (hlen > KVP_SAFETENSORS_MAX_HEADER)
        return kvp_err_set(err, KVP_ELIMIT, "%s: header length %" PRIu64 " exceeds the limit %u", f->path, hlen,
                           KVP_SAFETENSORS_MAX_HEADER);
    if (hlen > f->size - 8)
        return kvp_err_set(err, KVP_ETRUNC, "%s: header length %" PRIu64 " runs past the end (%" PRIu64 " bytes)",
                           f->path, hlen, f->size);
    f->data_offset = 8 + hlen;
    kvp_json *h;
    char jname[4200];
    snprintf(jname, sizeof jname, "%s: header", f->path);
    int rc = kvp_json_parse(&h, (const char *)f->base + 8, (size_t)hlen, jname, err);
    if (rc)
        return rc;
    if (h->type != KVP_JSON_OBJECT) {
        kvp_json_free(h);
        return kvp_err_set(err, KVP_EFORMAT, "%s: header: expected a JSON object", f->path);
    }
    size_t n = h->n;
    const kvp_json *md = kvp_json_get(h, "__metadata__");
    if (md)
        n--;
    if (md && fi == 0)
        rc = st_meta(&x, st, md);
    kvp_safetensors_tensor *nt = rc ? NULL : realloc(st->tensors, (size_t)(st->n_tensors + n + 1) * sizeof *nt);
    if (!rc && !nt)
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for %zu tensors", f->path, n);
    if (nt)
        st->tensors = nt;
    uint64_t first = st->n_tensors;
    for (size_t k = 0; k < h->n && !rc; k++) {
        if (&h->items[k] == md)
            continue;
        if (h->key_lens[k] != strlen(h->keys[k]) || h->key_lens[k] == 0) {
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: header: tensor name empty or holding a NUL", f->path);
            break;
        }
        kvp_safetensors_tensor *t = &st->tensors[st->n_tensors++];
        memset(t, 0, sizeof *t);
        t->shard = fi;
        rc = read_tensor(&x, f, h->keys[k], &h->items[k], t);
    }
    if (!rc)
        rc = check_overlap(&x, st->tensors + first, st->n_tensors - first);
    kvp_json_free(h);
    return rc;
}

/* ---- files, index, lookup ---- */

static int add_file(kvp_safetensors *st, const char *path, kvp_err *err)
{
    kvp_safetensors_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!nf)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    st->files = nf;
    kvp_safetensors_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof *f);
    f->in.fd = -1;
    f->path = strdup(path);
    if (!f->path)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    st->n_files++;
    int rc = kvp_in_open(&f->in, path, err);
    if (rc)
        return rc;
    if (!f->in.map && !(f->in.size_known && f->in.size == 0))
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: not a regular file (safetensors needs one to map)", path);
    f->base = f->in.map;
    f->size = f->in.size;
    return st_parse_file(st, st->n_files - 1, err);
}

static int name_cmp_ctx(const kvp_safetensors *st, size_t a, size_t b)
{
    return strcmp(st->tensors[a].name, st->tensors[b].name);
}

/* qsort has no context argument: sort pointers, then turn them into indices. */
static int ptr_name_cmp(const void *a, const void *b)
{
    return strcmp((*(const kvp_safetensors_tensor *const *)a)->name, (*(const kvp_safetensors_tensor *const *)b)->name);
}

static int build_index(kvp_safetensors *st, kvp_err *err)
{
    if (st->n_tensors == 0)
        return 0;
    const kvp_safetensors_tensor **v = malloc((size_t)st->n_tensors * sizeof *v);
    st->sorted = malloc((size_t)st->n_tensors * sizeof *st->sorted);
    if (!v || !st->sorted) {
        free(v);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", st->dir);
    }
    for (uint64_t i = 0; i < st->n_tensors; i++)
        v[i] = &st->tensors[i];
    qsort(v, (size_t)st->n_tensors, sizeof *v, ptr_name_cmp);
    int rc = 0;
    for (uint64_t i = 0; i < st->n_tensors; i++) {
        st->sorted[i] = (size_t)(v[i] - st->tensors);
        if (!rc && i && name_cmp_ctx(st, st->sorted[i - 1], st->sorted[i]) == 0)
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: tensor \"%.100s\" appears twice (also in %s)",
                             st->files[v[i]->shard].path, v[i]->name, st->files[v[i - 1]->shard].path);
    }
    free(v);
    return rc;
}

const kvp_safetensors_tensor *kvp_safetensors_find(const kvp_safetensors *st, const char *name)
{
    size_t lo = 0, hi = st->sorted ? (size_t)st->n_tensors : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const kvp_safetensors_tensor *t = &st->tensors[st->sorted[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Shard names must stay inside the folder. */
static int shard_name_ok(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static int open_index(kvp_safetensors *st, const char *index_path, kvp_err *err)
{
    kvp_json *j;
    int rc = kvp_json_parse_file(&j, index_path, INDEX_MAX, err);
    if (rc)
        return rc;
    const kvp_json *wm = kvp_json_get(j, "weight_map");
    const char **shards = NULL;
    size_t n_shards = 0;
    if (!wm || wm->type != KVP_JSON_OBJECT) {
        rc = kvp_err_set(err, KVP_EFORMAT, "%s: weight_map: missing or not an object (no safetensors index: give "
                         "the model's folder or its .safetensors file)", index_path);
        goto done;
    }
    shards = malloc((wm->n ? wm->n : 1) * sizeof *shards);
    if (!shards) {
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (size_t k = 0; k < wm->n; k++) {
        const kvp_json *v = &wm->items[k];
        if (v->type != KVP_JSON_STRING || v->len != strlen(v->str) || !shard_name_ok(v->str)) {
            rc = kvp_err_set(err, KVP_EFORMAT, "%s: weight_map.%.100s: expected a file name in the same folder",
                             index_path, wm->keys[k]);
            goto done;
        }
        shards[n_shards++] = v->str;
    }
    qsort(shards, n_shards, sizeof *shards, str_ptr_cmp);
    size_t u = 0;
    for (size_t k = 0; k < n_shards; k++)
        if (u == 0 || strcmp(shards[u - 1], shards[k]) != 0)
            shards[u++] = shards[k];
    if (u > KVP_SAFETENSORS_MAX_SHARDS) {
        rc = kvp_err_set(err, KVP_ELIMIT, "%s: weight_map: %zu shards, more than %u", index_path, u,
                         KVP_SAFETENSORS_MAX_SHARDS);
        goto done;
    }
    for (size_t k = 0; k < u && !rc; k++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", st->dir, shards[k]) >= sizeof path)
            rc = kvp_err_set(err, KVP_EINVAL, "%s: shard path too long", index_path);
        else
            rc = add_file(st, path, err);
    }
    if (!rc)
        rc = build_index(st, err);
    /* Every entry must be where the index says. */
    for (size_t k = 0; k < wm->n && !rc; k++) {
        const kvp_safetensors_tensor *t = kvp_safetensors_find(st, wm->keys[k]);
        const char *want = wm->items[k].str, *got = t ? strrchr(st->files[t->shard].path, '/') + 1 : NULL;
        if (!t)
            rc = kvp_err_set(err, KVP_ENOTFOUND, "%s: weight_map.%.100s: tensor not found in %s", index_path,
                             wm->keys[k], want);
        else if (strcmp(got, want) != 0)
            rc = kvp_err_set(err, KVP_EMISMATCH, "%s: weight_map.%.100s: listed in %s but found in %s", index_path,
                             wm->keys[k], want, got);
    }
done:
    free(shards);
    kvp_json_free(j);
    return rc;
}

static int set_dir(kvp_safetensors *st, const char *path, int is_dir, kvp_err *err)
{
    st->dir = strdup(path);
    if (!st->dir)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", path);
    if (!is_dir) {
        char *slash = strrchr(st->dir, '/');
        if (!slash)
            strcpy(st->dir, ".");
        else if (slash == st->dir)
            slash[1] = '\0';
        else
            *slash = '\0';
    }
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int st_open(kvp_safetensors *st, const char *path, kvp_err *err)
{
    struct stat sb;
    int is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    int rc = set_dir(st, path, is_dir, err);
    if (rc)
        return rc;
    if (!is_dir) {
        if (ends_with(path, ".json"))
            return open_index(st, path, err);
        rc = add_file(st, path, err);
        return rc ? rc : build_index(st, err);
    }
    char p[4096];
    if ((size_t)snprintf(p, sizeof p, "%s/model.safetensors.index.json", path) >= sizeof p)
        return kvp_err_set(err, KVP_EINVAL, "%s: path too long", path);
    if (stat(p, &sb) == 0)
        return open_index(st, p, err);
    snprintf(p, sizeof p, "%s/model.safetensors", path);
    if (stat(p, &sb) != 0)
        return kvp_err_set(err, KVP_ENOTFOUND, "%s: holds neither model.safetensors.index.json nor model.safetensors",
                           path);
    rc = add_file(st, p, err);
    return rc ? rc : build_index(st, err);
}

static void st_zero(kvp_safetensors *st)
{
    memset(st, 0, sizeof *st);
    kvp_meta_init(&st->meta);
}

int kvp_safetensors_open(kvp_safetensors *st, const char *path, kvp_err *err)
{
    st_zero(st);
    int rc = st_open(st, path, err);
    if (rc)
        kvp_safetensors_close(st);
    return rc;
}

int kvp_safetensors_open_mem(kvp_safetensors *st, const void *data, uint64_t size, const char *name, kvp_err *err)
{
    st_zero(st);
    const char *nm = name ? name : "<memory>";
    int rc = set_dir(st, nm, 0, err);
    st->files = rc ? NULL : calloc(1, sizeof *st->files);
    if (!rc && (!st->files || !(st->files[0].path = strdup(nm))))
        rc = kvp_err_set(err, KVP_ENOMEM, "%s: out of memory", nm);
    if (!rc) {
        st->n_files = 1;
        st->files[0].in.fd = -1;
        st->files[0].base = data;
        st->files[0].size = size;
        rc = st_parse_file(st, 0, err);
    }
    if (!rc)
        rc = build_index(st, err);
    if (rc)
        kvp_safetensors_close(st);
    return rc;
}

void kvp_safetensors_close(kvp_safetensors *st)
{
    for (uint64_t i = 0; st->tensors && i < st->n_tensors; i++)
        free(st->tensors[i].name);
    free(st->tensors);
    for (uint32_t i = 0; st->files && i < st->n_files; i++) {
        kvp_safetensors_file *f = &st->files[i];
        if (f->in.fd >= 0 || f->in.map || f->in.name_owned)
            kvp_in_close(&f->in);
        free(f->path);
    }
    free(st->files);
    free(st->sorted);
    free(st->dir);
    kvp_meta_free(&st->meta);
    st_zero(st);
}

int kvp_safetensors_release_peeked(kvp_in *in, const char *path, kvp_err *err)
{
    int piped = in->fd >= 0 && !kvp_in_reopenable(in);
    if (in->fd >= 0)
        kvp_in_close(in);
    if (piped)
        return kvp_err_set(err, KVP_EUNSUPPORTED, "%s: neither GGUF nor KVP, and not a regular file: a safetensors "
                           "model is mapped, so it cannot come through a pipe", path);
    return 0;
}
