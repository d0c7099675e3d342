"""PTX data types: width, lanes, and the register that carries them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PtxType:
    """A PTX instruction type such as ``bf16x2``: ``lanes`` values of ``lane`` in ``bits`` bits."""

    name: str
    bits: int
    kind: str  # "bits", "uint", "sint", "float" or "fp8"
    lane: str
    lanes: int = 1

    @property
    def reg_bits(self) -> int:
        """Width of the register operand that carries one value of this type.

        The fp8 lanes of a multimem vector need ``.b8`` registers (ptxas: "Arguments
        mismatch" for anything wider); the 8-bit integer types of ``ld``/``st`` take 16-bit
        registers; everything else a register of its own width.
        """
        return self.bits if self.kind == "fp8" else max(self.bits, 16)


def _t(name: str, bits: int, kind: str, lane: str | None = None, lanes: int = 1) -> PtxType:
    return PtxType(name, bits, kind, lane or name, lanes)


TYPES: dict[str, PtxType] = {
    t.name: t
    for t in (
        _t("b8", 8, "bits"), _t("b16", 16, "bits"), _t("b32", 32, "bits"),
        _t("b64", 64, "bits"), _t("b128", 128, "bits"),
        _t("u8", 8, "uint"), _t("u16", 16, "uint"), _t("u32", 32, "uint"), _t("u64", 64, "uint"),
        _t("s8", 8, "sint"), _t("s16", 16, "sint"), _t("s32", 32, "sint"), _t("s64", 64, "sint"),
        _t("f16", 16, "float"), _t("bf16", 16, "float"), _t("f32", 32, "float"),
        _t("f64", 64, "float"),
        _t("f16x2", 32, "float", "f16", 2), _t("bf16x2", 32, "float", "bf16", 2),
        _t("e4m3", 8, "fp8"), _t("e5m2", 8, "fp8"),
        _t("e4m3x2", 16, "fp8", "e4m3", 2), _t("e5m2x2", 16, "fp8", "e5m2", 2),
        _t("e4m3x4", 32, "fp8", "e4m3", 4), _t("e5m2x4", 32, "fp8", "e5m2", 4),
    )
}

INTEGER = ("b32", "b64", "u32", "u64", "s32", "s64")
HALF = ("f16", "bf16")
HALF_X2 = ("f16x2", "bf16x2")
FP8 = ("e4m3", "e5m2")
FP8_X2 = ("e4m3x2", "e5m2x2")
FP8_X4 = ("e4m3x4", "e5m2x4")
FP8_ALL = FP8 + FP8_X2 + FP8_X4
