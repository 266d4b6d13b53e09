"""Training: datasets in their published formats, the paper's recipes, resumable runs, evaluation.

``python -m training --help`` lists the commands; ``training.data`` reads the datasets.
"""
