/* The docs the code cites are in the repository (issue 15 item 5): a bare theory.md,
 * tuner-notes.md, style.md, netsor.md, architecture.md or orchestration.md is a file of docs/,
 * every other *.md that a source file mentions exists, and every citation such as
 * "theory.md §2.8", "tuner-notes §3" or "style.md §9" names a section that exists in that
 * document. (This file spells its made-up citations with escapes so that the walk does not see
 * them.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* "§" and "–" (en dash) in UTF-8, spelt as escapes so this file cites nothing by accident. */
#define SECT "\xc2\xa7"
#define NDASH "\xe2\x80\x93"

/* The documents of docs/ that the sources cite by bare name. A section is a markdown heading that
 * starts with its number ("## 2. ...", "### 2.8 ..."); style.md numbers its rules as a list
 * ("9. Framework and kernels apart"), so there a numbered list item is a section too. */
enum { N_DOCS = 6 };
static const struct {
    const char *name, *file;
    int items_are_sections;
} DOCS[N_DOCS] = {
    {"theory", "theory.md", 0},
    {"tuner-notes", "tuner-notes.md", 0},
    {"style", "style.md", 1},
    {"netsor", "netsor.md", 0},
    {"architecture", "architecture.md", 0},
    {"orchestration", "orchestration.md", 0},
};

typedef struct checker {
    const char *root;    /* repository root */
    char *doc[N_DOCS];   /* text of each document of docs/, NULL when missing */
    FILE *report;        /* where failures go as path:line: message (NULL: silent) */
    int failures;
    int cites;           /* section numbers checked */
    int mentions;        /* *.md mentions checked */
    int files;           /* files read */
} checker;

/* ------------------------------------------------------------------------------------------ */
/* Small helpers.                                                                             */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    size_t got;
    while (s != NULL && (got = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *t = realloc(s, cap * 2);
            if (t == NULL) {
                free(s);
                s = NULL;
                break;
            }
            s = t;
            cap *= 2;
        }
    }
    fclose(f);
    if (s != NULL)
        s[len] = '\0';
    return s;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static int is_path_char(char c)
{
    return is_word(c) || c == '.' || c == '/' || c == '-';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int line_of(const char *text, const char *p)
{
    int line = 1;
    for (const char *q = text; q < p; q++)
        line += *q == '\n';
    return line;
}

static void report_failure(checker *c, const char *path, const char *text, const char *at,
                           const char *fmt, ...)
{
    c->failures++;
    if (c->report == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(c->report, "%s:%d: ", path, line_of(text, at));
    vfprintf(c->report, fmt, ap);
    fputc('\n', c->report);
    va_end(ap);
}

/* Index of NAME in DOCS, or -1. */
static int doc_index(const char *name, size_t len)
{
    for (int i = 0; i < N_DOCS; i++)
        if (strlen(DOCS[i].name) == len && strncmp(DOCS[i].name, name, len) == 0)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Sections.                                                                                  */

/* Does TEXT have section NUM ("2.8", "3")? Headings "#... NUM[.] title"; with items, also
 * numbered list items "NUM. text" at the start of a line. */
static int doc_has_section(const char *text, const char *num, int items)
{
    size_t n = strlen(num);
    for (const char *l = text; l != NULL && *l != '\0';) {
        const char *p = l;
        int heading = *p == '#';
        while (*p == '#')
            p++;
        if (heading)
            while (*p == ' ')
                p++;
        if ((heading || items) && strncmp(p, num, n) == 0) {
            const char *e = p + n;
            /* the whole number: "2.8" must not match "2.80" or "2.8.1"; a final '.' is allowed */
            if (*e == '.')
                e++;
            if (!is_digit(*e) && *e != '.' && (heading ? *e == ' ' || *e == '\n' || *e == '\0'
                                                       : e > p + n && *e == ' '))
                return 1;
        }
        l = strchr(l, '\n');
        if (l != NULL)
            l++;
    }
    return 0;
}

/* Parse a section number at *pp ("2.8", "3"; a trailing '.' ends a sentence, not the number). */
static int parse_num(const char **pp, char *out, size_t cap)
{
    const char *p = *pp;
    size_t k = 0;
    if (!is_digit(*p))
        return 0;
    while (is_digit(*p) || (*p == '.' && is_digit(p[1]))) {
        if (k + 1 < cap)
            out[k++] = *p;
        p++;
    }
    out[k] = '\0';
    *pp = p;
    return 1;
}

static void check_section(checker *c, const char *path, const char *text, const char *at, int d,
                          const char *num)
{
    c->cites++;
    if (c->doc[d] == NULL)
        report_failure(c, path, text, at, "cites %s " SECT "%s but docs/%s is missing",
                       DOCS[d].file, num, DOCS[d].file);
    else if (!doc_has_section(c->doc[d], num, DOCS[d].items_are_sections))
        report_failure(c, path, text, at, "cites %s " SECT "%s: docs/%s has no section %s",
                       DOCS[d].file, num, DOCS[d].file, num);
}

/* After a doc name at P (just past "theory" or "theory" ".md"): an optional closing backquote,
 * blanks (a line break with its comment leader " * ", "# ", "// " too), then "§NUM", possibly
 * followed by ", §NUM", " and §NUM", "/§NUM" or a range "–NUM" / "-NUM". */
static void check_citation(checker *c, const char *path, const char *text, const char *name_at,
                           const char *p, int d)
{
    if (*p == '`')
        p++;
    while (*p == ' ' || *p == '\t' || *p == '\n') {
        if (*p++ == '\n') {
            while (*p == ' ' || *p == '\t')
                p++;
            if (*p == '*' || *p == '#')
                p++;
            else if (p[0] == '/' && p[1] == '/')
                p += 2;
        }
    }
    if (strncmp(p, SECT, 2) != 0)
        return;
    p += 2;
    while (*p == ' ')
        p++;
    char num[32];
    if (!parse_num(&p, num, sizeof num))
        return;
    check_section(c, path, text, name_at, d, num);
    for (;;) {
        const char *q = p;
        int need_sect = 1;
        if (strncmp(q, NDASH, 3) == 0) {
            q += 3;
            need_sect = 0;
        } else if (*q == '-') {
            q++;
            need_sect = 0;
        } else if (*q == ',' || *q == '/') {
            q++;
        } else if (strncmp(q, " and ", 5) == 0) {
            q += 5;
        } else {
            return;
        }
        while (*q == ' ')
            q++;
        if (strncmp(q, SECT, 2) == 0) {
            q += 2;
            while (*q == ' ')
                q++;
        } else if (need_sect) {
            return;
        }
        if (!parse_num(&q, num, sizeof num))
            return;
        check_section(c, path, text, name_at, d, num);
        p = q;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Mentions of *.md files.                                                                    */

/* Does ROOT/REL or DIR-of-PATH/REL exist? */
static int md_exists(const checker *c, const char *path, const char *rel)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", c->root, rel);
    if (is_file(buf))
        return 1;
    const char *slash = strrchr(path, '/');
    int dlen = slash != NULL ? (int)(slash - path) : 0;
    snprintf(buf, sizeof buf, "%s/%.*s%s%s", c->root, dlen, path, dlen > 0 ? "/" : "", rel);
    return is_file(buf);
}

/* The token ending at E (just past ".md"), starting at S. */
static void check_mention(checker *c, const char *path, const char *text, const char *s,
                          const char *e, int others)
{
    char tok[512];
    size_t len = (size_t)(e - s);
    if (len >= sizeof tok)
        return;
    memcpy(tok, s, len);
    tok[len] = '\0';
    const char *base = strrchr(tok, '/');
    base = base != NULL ? base + 1 : tok;
    size_t blen = strlen(base) - 3;
    if (blen == 0 || (s > text && s[-1] == ':') || strncmp(tok, "//", 2) == 0)
        return; /* "*.md", "%.md", a URL */
    int d = doc_index(base, blen);
    if (d >= 0 && base == tok) { /* a bare theory.md: it lives in docs/ */
        c->mentions++;
        if (c->doc[d] == NULL)
            report_failure(c, path, text, s, "mentions %s but docs/%s is missing", tok, tok);
        return;
    }
    if (d < 0 && strncmp(tok, "docs/", 5) != 0 && !others)
        return;
    c->mentions++;
    if (!md_exists(c, path, tok))
        report_failure(c, path, text, s, "mentions %s, which is not in the repository", tok);
}

/* Check one text buffer, read from PATH (relative to the root; used for messages and to resolve
 * relative mentions). OTHERS: check every *.md mention, not only docs/ and the cited docs
 * (markdown files mention outside documents by name). Returns the number of failures found. */
static int check_text(checker *c, const char *path, const char *text, int others)
{
    int before = c->failures;
    for (const char *p = text; *p != '\0'; p++) {
        /* a *.md mention ends here */
        if (strncmp(p, ".md", 3) == 0 && !is_word(p[3])) {
            const char *s = p;
            while (s > text && is_path_char(s[-1]))
                s--;
            check_mention(c, path, text, s, p + 3, others);
        }
        /* a citation starts here: a doc name at a word boundary (after "docs/" too) */
        if (p > text && (is_word(p[-1]) || p[-1] == '-' || p[-1] == '.'))
            continue;
        const char *w = p;
        size_t n = 0;
        while (is_word(w[n]) || (w[n] == '-' && is_word(w[n + 1])))
            n++;
        int d = n > 0 ? doc_index(w, n) : -1;
        if (d < 0)
            continue;
        const char *after = w + n;
        if (strncmp(after, ".md", 3) == 0 && !is_word(after[3]))
            after += 3;
        else if (is_path_char(*after) && *after != '-')
            continue; /* theory_x, netsor.c, netsor/ */
        check_citation(c, path, text, p, after, d);
    }
    return c->failures - before;
}

/* ------------------------------------------------------------------------------------------ */
/* The walk.                                                                                  */

static int is_source(const char *name, int *others)
{
    static const char *const ext[] = {".c", ".h", ".cu", ".py", ".sh", ".mk", ".nsr"};
    *others = 1;
    if (strcmp(name, "Makefile") == 0)
        return 1;
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
        if (ends_with(name, ext[i]))
            return 1;
    *others = 0; /* markdown and notebooks: citations and docs/ mentions only */
    return ends_with(name, ".md") || ends_with(name, ".ipynb");
}

static int skip_dir(const char *name)
{
    return strncmp(name, "build", 5) == 0 || strcmp(name, ".git") == 0 ||
           strcmp(name, "out") == 0 || strcmp(name, "__pycache__") == 0 ||
           strcmp(name, ".ipynb_checkpoints") == 0;
}

/* REL: a directory relative to the root ("" for the root itself). */
static void walk(checker *c, const char *rel)
{
    char dir[2048];
    snprintf(dir, sizeof dir, "%s%s%s", c->root, *rel ? "/" : "", rel);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char sub[2048], full[4096];
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(full, sizeof full, "%s/%s", c->root, sub);
        struct stat st;
        if (lstat(full, &st) != 0)
            continue;
        int others;
        if (S_ISDIR(st.st_mode)) {
            if (!skip_dir(e->d_name))
                walk(c, sub);
        } else if (S_ISREG(st.st_mode) && is_source(e->d_name, &others)) {
            char *text = read_all(full);
            if (text == NULL) {
                report_failure(c, sub, "", "", "cannot read");
                continue;
            }
            c->files++;
            check_text(c, sub, text, others);
            free(text);
        }
    }
    closedir(d);
}

static void checker_init(checker *c, const char *root, FILE *report)
{
    memset(c, 0, sizeof *c);
    c->root = root;
    c->report = report;
    for (int i = 0; i < N_DOCS; i++) {
        char path[2048];
        snprintf(path, sizeof path, "%s/docs/%s", root, DOCS[i].file);
        c->doc[i] = read_all(path);
    }
}

static void checker_free(checker *c)
{
    for (int i = 0; i < N_DOCS; i++)
        free(c->doc[i]);
}

static const char *root_dir(void)
{
    const char *r = getenv("TPK_ROOT");
    return r != NULL && *r != '\0' ? r : ".";
}

/* ------------------------------------------------------------------------------------------ */
/* Tests.                                                                                     */

/* Every document the sources cite by bare name is in docs/. */
static void test_docs_present(void **state)
{
    (void)state;
    checker c;
    checker_init(&c, root_dir(), stderr);
    for (int i = 0; i < N_DOCS; i++) {
        if (c.doc[i] == NULL)
            print_error("%s/docs/%s is missing\n", c.root, DOCS[i].file);
        assert_non_null(c.doc[i]);
        assert_true(strlen(c.doc[i]) > 100);
    }
    checker_free(&c);
}

/* The whole tree: no citation of a missing doc or section. */
static void test_tree_citations(void **state)
{
    (void)state;
    checker c;
    checker_init(&c, root_dir(), stderr);
    walk(&c, "");
    print_message("%d files, %d section citations, %d *.md mentions, %d failures\n", c.files,
                  c.cites, c.mentions, c.failures);
    /* the walk saw the tree: the sources cite the theory hundreds of times */
    assert_true(c.files > 100);
    assert_true(c.cites > 100);
    assert_true(c.mentions > 100);
    assert_int_equal(c.failures, 0);
    checker_free(&c);
}

/* Heading and list-item rules of doc_has_section. */
static void test_section_rules(void **state)
{
    (void)state;
    const char *doc = "# Title\n\n## 2. Architectures\n### 2.8 CNN\n### 2.10 Integral\n"
                      "1. a numbered item\n## 0. Summary\n#### 7.4\n";
    assert_true(doc_has_section(doc, "2", 0));
    assert_true(doc_has_section(doc, "2.8", 0));
    assert_true(doc_has_section(doc, "2.10", 0));
    assert_true(doc_has_section(doc, "0", 0));
    assert_true(doc_has_section(doc, "7.4", 0));
    assert_false(doc_has_section(doc, "2.1", 0)); /* not a prefix of 2.10 */
    assert_false(doc_has_section(doc, "8", 0));   /* not "### 2.8" */
    assert_false(doc_has_section(doc, "1", 0));   /* a list item is no heading ... */
    assert_true(doc_has_section(doc, "1", 1));    /* ... except where items are the sections */
    assert_true(doc_has_section(doc, "2.8", 1));
}

/* A made-up text: a mention of a doc that does not exist and a citation of a section that does
 * not exist give two failures; valid citations around them give none. */
static void test_checker_catches(void **state)
{
    (void)state;
    checker c;
    checker_init(&c, root_dir(), NULL);
    const char *good = "/* theory.md " SECT "2.8, docs/theory.md " SECT "3.2" NDASH "3.4, style.md "
                       SECT "9, `docs/tuner-notes.md` " SECT "1, " SECT "3, theory " SECT "7.4.\n"
                       " * see docs/netsor.md, architecture.md and tuner/README.md; tuner-notes\n"
                       " * " SECT "3 \"Lookup\" */\n";
    assert_int_equal(check_text(&c, "tests/test_docs.c", good, 1), 0);
    assert_int_equal(c.cites, 8);
    assert_int_equal(c.mentions, 7);

    const char *bad = "/* the constants of docs/tensor-notes" ".md, and the theory.md "
                      SECT "2.11\n * recursion */\n";
    c.report = stderr;
    fprintf(stderr, "expected (made-up text), two failures:\n");
    assert_int_equal(check_text(&c, "made-up.c", bad, 1), 2);
    c.report = NULL;

    /* each kind alone, and the second number of a list or range */
    assert_int_equal(check_text(&c, "x.c", "tuner-notes " SECT "9", 1), 1);
    assert_int_equal(check_text(&c, "x.c", "style.md " SECT "99", 1), 1);
    assert_int_equal(check_text(&c, "x.c", "theory.md " SECT "5.2" NDASH "5.9", 1), 1);
    assert_int_equal(check_text(&c, "x.c", "theory.md " SECT "1, " SECT "9", 1), 1);
    assert_int_equal(check_text(&c, "x.c", "architecture.md " SECT "1", 1), 1);
    assert_int_equal(check_text(&c, "x.c", "see docs/missing" ".md", 1), 1);
    assert_int_equal(check_text(&c, "x.c", "see lib/README" ".md", 1), 1);
    /* markdown may name outside documents; the cited docs it must still find */
    assert_int_equal(check_text(&c, "docs/x" ".md", "TVM's `_posts/tirx" ".md`", 0), 0);
    assert_int_equal(check_text(&c, "docs/x" ".md", "theory.md " SECT "12", 0), 1);
    /* not citations: other words, globs, URLs */
    assert_int_equal(check_text(&c, "x.c", "gp_theory.py " SECT "9; netsor.c " SECT "9", 1), 0);
    assert_int_equal(check_text(&c, "x.mk", "$(wildcard docs/*.md) https://x.org/a" ".md", 1), 0);

    /* a doc missing from docs/: its mentions and its citations fail */
    free(c.doc[2]);
    c.doc[2] = NULL;
    assert_int_equal(check_text(&c, "x.c", "style.md " SECT "9", 1), 2);
    checker_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_present),
        cmocka_unit_test(test_section_rules),
        cmocka_unit_test(test_checker_catches),
        cmocka_unit_test(test_tree_citations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
