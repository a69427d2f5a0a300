"""The mutation tooling (tools/mutation/run.py over colibri/tools/cmutate.py and
mutation_report.py): the C mutation sites skip comments, strings and preprocessor lines, the
sample is fixed by its seed, and the score is killed / (all - equivalent), timeouts killed,
stillborn mutants apart."""

from __future__ import annotations

import pytest

from colibri.tools import cmutate, mutation_report

C_SRC = '''#include <stdio.h>
#define LIM (1 < 2)
/* a < b && c */
static int f(int a, int b) {
    // x == y
    const char *s = "a<b||c";
    char c = '<';
    if (a <= b && !a) return a + b - 1;
    for (int i = 0; i < 10; i++) a -= b;
    return a->b > 0 ? 2 : c;
}
'''


def test_sites_mutate_code_only(tmp_path):
    f = tmp_path / "x.c"
    f.write_text(C_SRC)
    got = [(m.line, m.orig, m.new) for m in cmutate.sites(f, "x.c")]
    assert got == [
        (8, "<=", "<"), (8, "&&", "||"), (8, "!", ""), (8, "+", "-"), (8, "-", "+"),
        (8, "1", "0"), (9, "0", "1"), (9, "<", "<="), (9, "10", "11"), (9, "++", "--"),
        (9, "-=", "+="), (10, ">", ">="), (10, "0", "1"), (10, "2", "3")]
    m = next(m for m in cmutate.sites(f, "x.c") if m.orig == "&&")
    assert m.id == "x.c:8:16:&&->||"
    assert m.mutated == "if (a <= b || !a) return a + b - 1;"
    assert cmutate.apply(C_SRC, m).count("||") == 2  # the string's and the mutant's


def test_the_sample_is_fixed_by_its_seed(tmp_path):
    f = tmp_path / "x.c"
    f.write_text(C_SRC)
    muts = cmutate.sites(f, "x.c")
    a, b = cmutate.sample(muts, 5, 49), cmutate.sample(muts, 5, 49)
    assert a == b and len(a) == 5 and a != cmutate.sample(muts, 5, 50)
    assert [m.start for m in a] == sorted(m.start for m in a)
    assert cmutate.sample(muts, 0, 1) == muts and cmutate.sample(muts, 99, 1) == muts


def test_score_counts_timeouts_killed_and_sets_equivalents_and_stillborn_apart():
    run = {"area": "a", "kind": "c", "files": ["f"], "tests": ["t"], "sample": 6, "seed": 1,
           "seconds": 3.0, "results": [
               {"id": "k", "status": "killed", "diff": ""},
               {"id": "t", "status": "timeout", "diff": ""},
               {"id": "s", "status": "survived", "diff": "- a\n+ b"},
               {"id": "n", "status": "no tests", "diff": ""},
               {"id": "e", "status": "survived", "diff": ""},
               {"id": "b", "status": "stillborn", "diff": ""}]}
    s = mutation_report.summary(run, {"e": "same value"})
    assert (s["killed"], s["timeout"], s["survived"], s["no_tests"], s["equivalent"],
            s["stillborn"], s["counted"]) == (2, 1, 2, 1, 1, 1, 4)
    assert s["score"] == 50.0 and [x["id"] for x in s["survivors"]] == ["s", "n"]
    # a listed equivalent that a test killed, or that the run did not reach, is not subtracted
    run["results"] += [{"id": "x", "status": "killed", "diff": ""},
                       {"id": "y", "status": "not run", "diff": ""}]
    s = mutation_report.summary(run, {"e": "same", "x": "wrong", "y": "same"})
    assert (s["killed"], s["equivalent"], s["not_run"], s["counted"]) == (3, 1, 1, 5)
    assert s["listed_but_killed"] == ["x"]


def test_equivalents_need_a_reason(tmp_path):
    f = tmp_path / "eq.txt"
    f.write_text("# comment\n\nx.c:1:2:<-><= both sides equal there\n")
    assert mutation_report.load_equivalents(f) == {"x.c:1:2:<-><=": "both sides equal there"}
    f.write_text("x.c:1:2:<-><=\n")
    with pytest.raises(SystemExit, match="has no reason"):
        mutation_report.load_equivalents(f)
