"""Offline scoring and evaluation on Ray Data: the serving declaration, limits and engines over image collections.

sources.py     where the images are: a directory tree or a Parquet/CSV list of paths, on any filesystem pyarrow reads
decoding.py    bytes -> the model's pixels in CPU tasks, with the Preprocessor's own code and limits; bad files as rows
scoring.py     the variants' engines in an actor, opened as a Classifier opens them; a row per image and variant
sizing.py      the actor pool: how many actors, what each asks for, from the cluster and the config (pure)
pipeline.py    the Dataset: source -> decode tasks -> scoring actors; `score` writes it as Parquet and sums it up
evaluation.py  accuracy per variant on a labelled tree, agreement with the baseline, the per-class drop; its report

Its command line is `python -m app.batch score|evaluate` (`app.batch.cli`).
"""
