/* NETSOR front end, stage 1: the lexer (source text → tokens), plus the arena and the
 * error/note helpers shared by all stages. Newlines end statements except inside ( ) [ ]
 * and after a token that cannot end one (a binary operator, `=`, `,`, `~`, `{`). */
#include "netsor-impl.h"
#include "tpk/alloc.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- Arena ------------------------------------------------------------------------------------ */
typedef struct nsr_chunk {
    struct nsr_chunk *next;
    size_t used, cap;
    _Alignas(max_align_t) unsigned char data[];
} nsr_chunk;

struct nsr_arena {
    nsr_chunk *head;
    tpk_allocator al; /* of the chunks and this struct */
};

nsr_arena *nsr_arena_alloc(tpk_ctx *ctx)
{
    nsr_arena *a = tpk_calloc(ctx, 1, sizeof(nsr_arena));
    if (a != NULL)
        a->al = tpk_ctx_allocator(ctx);
    return a;
}

void nsr_arena_free(nsr_arena *a)
{
    if (a == NULL)
        return;
    tpk_allocator al = a->al;
    nsr_chunk *c = a->head;
    while (c != NULL) {
        nsr_chunk *next = c->next;
        tpk_mem_free(&al, c);
        c = next;
    }
    tpk_mem_free(&al, a);
}

void *nsr_alloc(nsr_arena *a, size_t size)
{
    const size_t align = _Alignof(max_align_t);
    size = (size + align - 1) / align * align;
    if (size == 0)
        size = align;
    nsr_chunk *c = a->head;
    if (c == NULL || c->cap - c->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        c = tpk_mem_malloc(&a->al, sizeof(nsr_chunk) + cap, NULL); /* the caller reports */
        if (c == NULL)
            return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

char *nsr_strndup(nsr_arena *a, const char *s, size_t n)
{
    char *d = nsr_alloc(a, n + 1);
    if (d != NULL) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* ---- Diagnostics ------------------------------------------------------------------------------ */
int nsr_error(nsr_state *S, int status, int line, int col, const char *fmt, ...)
{
    char msg[TPK_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!S->failed && S->set_value) /* a --set value is one line: say the column in words */
        TPK_ERROR(S->ctx, status, "%s (column %d): %s", S->file, col, msg);
    else if (!S->failed)
        TPK_ERROR(S->ctx, status, "%s:%d:%d: %s", S->file, line, col, msg);
    S->failed = 1;
    return status;
}

int nsr_oom(nsr_state *S)
{
    if (!S->failed)
        TPK_ERROR(S->ctx, TPK_ENOMEM, "%s: out of memory", S->file);
    S->failed = 1;
    return TPK_ENOMEM;
}

void nsr_note(nsr_state *S, int line, int col, const char *fmt, ...)
{
    if (S->opts == NULL || S->opts->diag == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(S->opts->diag, "%s:%d:%d: note: ", S->file, line, col);
    vfprintf(S->opts->diag, fmt, ap);
    fputc('\n', S->opts->diag);
    va_end(ap);
}

const char *nsr_tok_name(int kind)
{
    static const char *const names[] = {
        "end of file", "end of line", "name", "number", "'_'", "'('", "')'", "'['", "']'",
        "'{'", "'}'", "','", "':'", "';'", "'~'", "'='", "'..'", "'+'", "'-'", "'*'", "'/'",
        "'^'", "'''"};
    if (kind < 0 || kind >= (int)(sizeof names / sizeof names[0]))
        return "token";
    return names[kind];
}

/* ---- Lexer ------------------------------------------------------------------------------------ */
typedef struct lexer {
    nsr_state *S;
    const char *src;
    size_t pos;
    int line, col;
    nsr_token *tok;
    int ntok, cap;
    int depth; /* ( [ nesting: newlines inside are whitespace */
} lexer;

static int push(lexer *L, int kind, int line, int col, int start)
{
    if (L->ntok == L->cap) {
        int cap = L->cap ? 2 * L->cap : 256;
        nsr_token *t = nsr_alloc(L->S->arena, (size_t)cap * sizeof *t);
        if (t == NULL)
            return nsr_oom(L->S);
        if (L->ntok)
            memcpy(t, L->tok, (size_t)L->ntok * sizeof *t);
        L->tok = t;
        L->cap = cap;
    }
    nsr_token *t = &L->tok[L->ntok++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = line;
    t->col = col;
    t->start = start;
    t->end = (int)L->pos;
    return TPK_OK;
}

/* A newline ends a statement unless the previous token asks for a continuation. */
static int newline_ends_statement(const lexer *L)
{
    if (L->depth > 0 || L->ntok == 0)
        return 0;
    switch (L->tok[L->ntok - 1].kind) {
    case NSR_T_NL: case NSR_T_PLUS: case NSR_T_MINUS: case NSR_T_STAR: case NSR_T_SLASH:
    case NSR_T_CARET: case NSR_T_EQ: case NSR_T_COMMA: case NSR_T_TILDE: case NSR_T_LC:
    case NSR_T_SEMI: case NSR_T_COLON: case NSR_T_DOTDOT:
        return 0;
    default:
        return 1;
    }
}

static int lex_number(lexer *L, int line, int col)
{
    const char *s = L->src + L->pos;
    size_t n = 0;
    while (isdigit((unsigned char)s[n]))
        n++;
    /* "1..T" is a range, not "1." followed by ".T" */
    if (s[n] == '.' && s[n + 1] != '.') {
        n++;
        while (isdigit((unsigned char)s[n]))
            n++;
    }
    if (s[n] == 'e' || s[n] == 'E') {
        size_t m = n + 1;
        if (s[m] == '+' || s[m] == '-')
            m++;
        if (isdigit((unsigned char)s[m])) {
            while (isdigit((unsigned char)s[m]))
                m++;
            n = m;
        }
    }
    if (isalpha((unsigned char)s[n]) || s[n] == '_')
        return nsr_error(L->S, TPK_ESYNTAX, line, col, "malformed number '%.*s'",
                         (int)(n + 1 > 40 ? 40 : n + 1), s);
    char buf[64];
    if (n >= sizeof buf)
        return nsr_error(L->S, TPK_ESYNTAX, line, col, "number too long");
    memcpy(buf, s, n);
    buf[n] = '\0';
    int start = (int)L->pos;
    L->pos += n;
    L->col += (int)n;
    double v = strtod(buf, NULL);
    /* said where it is written (issue 18: --set L=1e400 was "prog.nsr:1:1: a parameter value
     * is not finite") */
    if (!isfinite(v))
        return nsr_error(L->S, TPK_ESYNTAX, line, col, "number '%s' is beyond the range of a "
                         "double (at most about 1.8e308)", buf);
    if (push(L, NSR_T_NUM, line, col, start))
        return TPK_ENOMEM;
    L->tok[L->ntok - 1].num = v;
    return TPK_OK;
}

int nsr_lex(nsr_state *S, const char *src, nsr_token **toks, int *ntoks)
{
    lexer L = {.S = S, .src = src, .line = 1, .col = 1};
    for (;;) {
        char c = src[L.pos];
        int line = L.line, col = L.col, start = (int)L.pos;
        if (c == '\0')
            break;
        if (c == '\n') {
            if (newline_ends_statement(&L) && push(&L, NSR_T_NL, line, col, start))
                return TPK_ENOMEM;
            L.pos++;
            L.line++;
            L.col = 1;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r') {
            L.pos++;
            L.col++;
            continue;
        }
        if (c == '#') { /* comment to end of line */
            while (src[L.pos] != '\0' && src[L.pos] != '\n') {
                L.pos++;
                L.col++;
            }
            continue;
        }
        if (isdigit((unsigned char)c) || (c == '.' && isdigit((unsigned char)src[L.pos + 1]))) {
            int st = lex_number(&L, line, col);
            if (st)
                return st;
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t n = 0;
            while (isalnum((unsigned char)src[L.pos + n]) || src[L.pos + n] == '_')
                n++;
            if (n > 64)
                return nsr_error(S, TPK_ESYNTAX, line, col, "name too long (more than 64 characters)");
            int kind = (n == 1 && c == '_') ? NSR_T_HOLE : NSR_T_NAME;
            const char *text = nsr_strndup(S->arena, src + L.pos, n);
            if (text == NULL)
                return nsr_oom(S);
            L.pos += n;
            L.col += (int)n;
            if (push(&L, kind, line, col, start))
                return TPK_ENOMEM;
            L.tok[L.ntok - 1].text = text;
            continue;
        }
        int kind;
        size_t len = 1;
        switch (c) {
        case '(': kind = NSR_T_LP; L.depth++; break;
        case ')': kind = NSR_T_RP; if (L.depth > 0) L.depth--; break;
        case '[': kind = NSR_T_LB; L.depth++; break;
        case ']': kind = NSR_T_RB; if (L.depth > 0) L.depth--; break;
        case '{': kind = NSR_T_LC; break;
        case '}': kind = NSR_T_RC; break;
        case ',': kind = NSR_T_COMMA; break;
        case ':': kind = NSR_T_COLON; break;
        case ';': kind = NSR_T_SEMI; break;
        case '~': kind = NSR_T_TILDE; break;
        case '=': kind = NSR_T_EQ; break;
        case '+': kind = NSR_T_PLUS; break;
        case '-': kind = NSR_T_MINUS; break;
        case '*': kind = NSR_T_STAR; break;
        case '/': kind = NSR_T_SLASH; break;
        case '^': kind = NSR_T_CARET; break;
        case '\'': kind = NSR_T_QUOTE; break;
        case '.':
            if (src[L.pos + 1] == '.') {
                kind = NSR_T_DOTDOT;
                len = 2;
                break;
            }
            /* fall through */
        default:
            if (isprint((unsigned char)c))
                return nsr_error(S, TPK_ESYNTAX, line, col, "unexpected character '%c'", c);
            return nsr_error(S, TPK_ESYNTAX, line, col, "unexpected byte 0x%02x",
                             (unsigned)(unsigned char)c);
        }
        L.pos += len;
        L.col += (int)len;
        if (push(&L, kind, line, col, start))
            return TPK_ENOMEM;
    }
    if (push(&L, NSR_T_NL, L.line, L.col, (int)L.pos) || push(&L, NSR_T_EOF, L.line, L.col, (int)L.pos))
        return TPK_ENOMEM;
    *toks = L.tok;
    *ntoks = L.ntok;
    return TPK_OK;
}
