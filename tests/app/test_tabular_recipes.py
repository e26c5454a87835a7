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
    x, y = loader(return_X_y=True)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y if stratify else None)


def test_diabetes_regression_is_within_10_percent_of_linear_regression(graph_mode, tmp_path):
    train_x, test_x, train_y, test_y = split(load_diabetes, stratify=False)
    baseline = np.abs(LinearRegression().fit(train_x, train_y).predict(test_x) - test_y).mean()

    result = train(compose_config(["recipe=diabetes_regression", "logger=quiet", f"run_dir={tmp_path}"]))
    features, target = result.data.eval_arrays
    scaler = StandardScaler().fit(train_x)  # the same rows, standardised as the data module says it does
    np.testing.assert_allclose(features, scaler.transform(test_x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(target.reshape(-1), test_y, rtol=1e-6)
    assert result.metrics["mae"] <= 1.1 * baseline, (result.metrics["mae"], baseline)
    assert result.metrics["loss"] == pytest.approx(result.metrics["mse"], rel=1e-5)  # loss=mse on one batch


def test_wine_mlp_is_within_2_points_of_logistic_regression(graph_mode, tmp_path):
    train_x, test_x, train_y, test_y = split(load_wine, stratify=True)
    scaler = StandardScaler().fit(train_x)
    baseline = (LogisticRegression(max_iter=1000).fit(scaler.transform(train_x), train_y)
                .predict(scaler.transform(test_x)) == test_y).mean()

    result = train(compose_config(["recipe=wine_mlp", "logger=quiet", f"run_dir={tmp_path}"]))
    features, target = result.data.eval_arrays
    np.testing.assert_allclose(features, scaler.transform(test_x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(target, test_y)
    assert result.metrics["accuracy"] >= baseline - 0.02, (result.metrics["accuracy"], baseline)
    assert type(result.network).__name__ == "MLP" and result.network.in_features == 13
