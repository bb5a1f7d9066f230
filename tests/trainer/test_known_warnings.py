"""Known dependency warnings (``rljob_trainer.known_warnings``) are silenced, and nothing else."""

from __future__ import annotations


def test_known_dependency_warnings_are_silenced_and_nothing_else() -> None:
    import warnings

    from rljob_trainer.known_warnings import silence_known_warnings

    def warn_from(module: str, message: str, category: type[Warning]) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            silence_known_warnings()
            warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
        return [str(w.message) for w in seen]

    deprecated = "`gradient_checkpointing_enable` is deprecated and will be removed in v6. Use `activation_checkpointing_enable` instead."
    assert warn_from("transformers.modeling_utils", deprecated, FutureWarning) == []
    assert warn_from("transformers.training_args", deprecated.replace("_enable", ""), FutureWarning) == []
    omp = "OMP_NUM_THREADS/MKL_NUM_THREADS unset, we set it at 1 to improve oob performance."
    assert warn_from("accelerate.state", omp, UserWarning) == []
    # The same text from elsewhere, another category, or another deprecation still shows.
    assert warn_from("rljob_trainer.worker", deprecated, FutureWarning) == [deprecated]
    assert warn_from("transformers.modeling_utils", deprecated, DeprecationWarning) == [deprecated]
    other = "`use_cache=True` is deprecated and will be removed in v6."
    assert warn_from("transformers.modeling_utils", other, FutureWarning) == [other]
