"""The paper's experiments: what its tables say, measured on this project's runs and kept beside them.

``training`` turns a dataset into a checkpoint; this package reads what the runs left (cards, per-patch test
records) and answers the paper's questions with them: Table 1 over seeds and its claims (``results_tables``,
``table1_claims``, ``table1_cards``), Table 3 on the same test patches with the paper's release beside it and its
claims as paired tests (``table3``, ``table3_over_seeds``, ``paper_release``, ``paired_tests``), Fig. 5 over seeds
(``fig5_over_seeds``), which run ships (``shipped_selection``), the per-patch records bound to their cards
(``patch_records``, ``card_records``) and the blocks of README.md and docs/ written from all of it
(``generated_blocks``).

It imports ``models`` and ``training``; nothing of the project imports it but its tests and the benchmarks that
write records. ``python -m experiments --help`` lists the commands.
"""
