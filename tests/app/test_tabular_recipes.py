"""The shipped non-image recipes end to end, against scikit-learn baselines fitted in the test on the same split."""
import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_wine
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from trainkit.app import train
from trainkit.app.config import compose_config


def split(loader, stratify):
    """(train, validation, test) features and targets: 20 % held out for test, then 10 % of the whole for
    validation, each with scikit-learn's train_test_split (random_state 0)."""
    x, y = loader(return_X_y=True)
    rest_x, test_x, rest_y, test_y = train_test_split(x, y, test_size=0.2, random_state=0,
                                                      stratify=y if stratify else None)
    train_x, val_x, train_y, val_y = train_test_split(rest_x, rest_y, test_size=0.1 / 0.8, random_state=0,
                                                      stratify=rest_y if stratify else None)
    return train_x, val_x, test_x, train_y, val_y, test_y


def test_diabetes_regression_is_within_10_percent_of_linear_regression(graph_mode, tmp_path):
    train_x, val_x, test_x, train_y, val_y, test_y = split(load_diabetes, stratify=False)
    baseline = np.abs(LinearRegression().fit(train_x, train_y).predict(test_x) - test_y).mean()

    result = train(compose_config(["recipe=diabetes_regression", "logger=quiet", f"run_dir={tmp_path}"]))
    scaler = StandardScaler().fit(train_x)  # the same rows, standardised as the data module says it does
    for (features, target), (x, y) in ((result.data.eval_arrays, (val_x, val_y)),
                                       (result.data.test_arrays, (test_x, test_y))):
        np.testing.assert_allclose(features, scaler.transform(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(target.reshape(-1), y, rtol=1e-6)
    assert result.metrics["test_mae"] <= 1.1 * baseline, (result.metrics["test_mae"], baseline)
    assert result.metrics["loss"] == pytest.approx(result.metrics["mse"], rel=1e-5)  # loss=mse on one batch


def test_wine_mlp_is_within_one_test_row_of_logistic_regression(graph_mode, tmp_path):
    train_x, val_x, test_x, train_y, val_y, test_y = split(load_wine, stratify=True)
    scaler = StandardScaler().fit(train_x)
    baseline = (LogisticRegression(max_iter=1000).fit(scaler.transform(train_x), train_y)
                .predict(scaler.transform(test_x)) == test_y).mean()

    result = train(compose_config(["recipe=wine_mlp", "logger=quiet", f"run_dir={tmp_path}"]))
    for (features, target), (x, y) in ((result.data.eval_arrays, (val_x, val_y)),
                                       (result.data.test_arrays, (test_x, test_y))):
        np.testing.assert_allclose(features, scaler.transform(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(target, y)
    # within one of the 36 test rows (2.8 points) of logistic regression: the MLP trains on the 124 rows left
    # once validation is carved out, and best.ckpt is chosen on 18 validation rows
    assert result.metrics["test_accuracy"] >= baseline - 1 / len(test_y) - 1e-9, (result.metrics["test_accuracy"],
                                                                                   baseline)
    assert type(result.network).__name__ == "MLP" and result.network.in_features == 13
