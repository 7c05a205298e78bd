"""The FlashInfer adapter checks at construction that FlashInfer is there and new enough for the
wrapper API it binds: a clear error then, not a TypeError deep inside the first plan()."""

import sys
import types

import pytest

from attnmeta.runtime.flashinfer_adapter import FlashInferDecodeAdapter, FlashInferVersionError


def test_missing_flashinfer_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> ImportError
    with pytest.raises(FlashInferVersionError, match=r"FlashInfer is not installed .*attnmeta\[flashinfer\]"):
        FlashInferDecodeAdapter(object(), 32, 8, 128)


@pytest.mark.parametrize("version", ["0.5.3", "0.2.0+cu124"])
def test_an_old_flashinfer_is_refused(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__=version))
    with pytest.raises(FlashInferVersionError, match=rf"FlashInfer {version.replace('+', '.')} is older than 0.6"):
        FlashInferDecodeAdapter(object(), 32, 8, 128)
