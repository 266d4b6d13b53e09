"""The paper's Table 1 claims tested on seeds' cards: the exact permutation test and the table built from cards."""

import json

import pytest

from experiments.cli import main as cli_main
from experiments.results_tables import seed_table
from experiments.table1_claims import CLAIMS, claim_verdict, claims_table, permutation_p
from tests.conftest import REPO


def test_permutation_p_is_the_exact_fraction_of_splits():
    # Every one of A's seeds below every one of B's: only the observed split of the 20 is that extreme.
    assert permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(1 / 20)
    assert permutation_p([4.0, 5.0, 6.0], [1.0, 2.0, 3.0]) == 1.0
    # {1, 2, 4} against {3, 5, 6}: the splits whose A-sum is at most 7 are {1, 2, 3} and {1, 2, 4}.
    assert permutation_p([1.0, 2.0, 4.0], [3.0, 5.0, 6.0]) == pytest.approx(2 / 20)
    # Ties everywhere: every split is as extreme as the observed one.
    assert permutation_p([0.02] * 3, [0.02] * 3) == 1.0
    # Unequal sizes: C(5, 2) = 10 splits.
    assert permutation_p([0.010, 0.011], [0.020, 0.021, 0.022]) == pytest.approx(1 / 10)


def test_verdicts():
    assert claim_verdict([0.017, 0.018, 0.0175], [0.020, 0.021, 0.0205]) == (pytest.approx(0.05), "holds")
    assert claim_verdict([0.020, 0.021, 0.0205], [0.017, 0.018, 0.0175])[1] == "reversed"
    # A-sum 0.0555 of 0.114; 7 of the 20 splits reach at most that: {17, 17.5} with 18, 20, 20.5 or 21, and
    # {17, 18, 20}, {17, 18, 20.5}, {17.5, 18, 20} (in thousandths).
    p, verdict = claim_verdict([0.017, 0.021, 0.0175], [0.020, 0.018, 0.0205])
    assert p == pytest.approx(0.35) and verdict == "not resolved (ahead, within the seeds' spread)"
    # Two seeds each: the rarest split has p = 1/6, so nothing can be decided at 0.05.
    assert claim_verdict([0.01, 0.011], [0.02, 0.021]) == (None, "not yet: needs 3 seeds of each")
    assert claim_verdict([], [0.02, 0.021, 0.022]) == (None, "not yet: needs 3 seeds of each")


def _write_card(folder, arch, seed, error):
    card = {"arch": arch, "parameters": 73130, "training": {"config": {"seed": seed}, "epochs_completed": 100},
            "metrics": {"test_error": error, "valid_error": error, "test_count": 50000}}
    folder.mkdir(exist_ok=True)
    (folder / f"{arch}-seed{seed}.json").write_text(json.dumps(card))


def test_claims_table_from_cards(tmp_path, capsys):
    for seed, (ours, big) in enumerate([(0.0170, 0.0190), (0.0172, 0.0195), (0.0168, 0.0191)]):
        _write_card(tmp_path, "a_p4cnn", seed, ours)
        _write_card(tmp_path, "big19_p4cnn", seed, big)
    _write_card(tmp_path, "fa_p4cnn", 0, 0.018)
    table = claims_table(tmp_path)
    lines = table.splitlines()
    assert len(lines) == 2 + len(CLAIMS)
    assert ("| full attention beats P4CNN of its size | a_p4cnn | big19_p4cnn | 1.700 +- 0.020 | 1.920 +- 0.026 "
            "| 3 + 3 | 0.05 | holds |") in lines
    assert ("| full attention beats every other attention | a_p4cnn | fa_p4cnn | 1.700 +- 0.020 | 1.800 | 3 + 1 "
            "| - | not yet: needs 3 seeds of each |") in lines
    assert "| ach_p4cnn | big15_p4cnn | no runs | no runs | 0 + 0 |" in table
    assert cli_main(["report", str(tmp_path), "--claims"]) == 0
    assert capsys.readouterr().out.strip() == table


def test_readme_tables_are_the_ones_the_committed_cards_build():
    # Anyone can rebuild the README's Table 1 and its claims from results/rot_mnist and get the same text.
    readme = (REPO / "README.md").read_text()
    cards = REPO / "results" / "rot_mnist"
    assert seed_table(cards) in readme
    assert claims_table(cards) in readme


def test_readme_refresh_rewrites_only_the_tables(tmp_path, capsys):
    for seed, error in enumerate([0.0210, 0.0205, 0.0215]):
        _write_card(tmp_path / "cards", "a_p4cnn", seed, error)
    stale = seed_table(tmp_path / "cards").replace("2.100 +- 0.050", "9.999")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nBefore.\n\n{stale}\n\nBetween.\n\n{claims_table(tmp_path / 'no cards')}\nAfter.\n")
    assert cli_main(["report", str(tmp_path / "cards"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text == (f"# Title\n\nBefore.\n\n{seed_table(tmp_path / 'cards')}\n\nBetween.\n\n"
                    f"{claims_table(tmp_path / 'cards')}\nAfter.\n")
    assert "rewritten" in capsys.readouterr().out
    assert cli_main(["report", str(tmp_path / "cards"), "--readme", str(readme)]) == 0
    assert "already match" in capsys.readouterr().out
    assert readme.read_text() == text


def test_readme_refresh_refuses_a_readme_without_the_tables(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# No tables here\n")
    assert cli_main(["report", str(tmp_path), "--readme", str(readme)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: expected one table headed") and "| model | parameters" in error
    assert error.rstrip().endswith("found 0")
    assert readme.read_text() == "# No tables here\n"
