"""CPU levels: the recipe's ``cpu`` and ``--cpu`` turn into ggml's CMake options, validated with "did you mean",
recorded in the plan; options a level decides are refused in ``[cmake]`` and ``--cmake``."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaforge.build.cpu_level import LEVELS, check_cpu_level, cpu_cmake
from llamaforge.build.plan import BuildOptions, plan_build
from llamaforge.build.recipes import load_recipe
from llamaforge.core.errors import InvalidOption, RecipeError

pytestmark = pytest.mark.quick


def _args(cpu: str | None = None) -> set[str]:
    return set(plan_build(load_recipe("default"), BuildOptions(no_patches=True, cpu=cpu)).cmake_args)


def test_default_recipe_builds_every_variant_as_loadable_modules() -> None:
    assert load_recipe("default").cpu == "variants"
    args = _args()
    assert {
        "-DGGML_CPU_ALL_VARIANTS=ON",
        "-DGGML_BACKEND_DL=ON",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_NATIVE=OFF",
        "-DCMAKE_INSTALL_RPATH=$ORIGIN",
        "-DGGML_RPC=ON",
    } <= args
    assert not any(arg.startswith("-DGGML_AVX") for arg in args)


def test_native_is_one_module_for_the_build_machine() -> None:
    args = _args("native")
    assert {"-DGGML_NATIVE=ON", "-DGGML_CPU_ALL_VARIANTS=OFF", "-DGGML_BACKEND_DL=OFF"} <= args
    assert not any(arg.startswith("-DGGML_AVX") for arg in args)


def test_x86_64_v3_sets_every_feature_explicitly() -> None:
    args = _args("x86-64-v3")
    on = {"SSE42", "AVX", "AVX2", "BMI2", "FMA", "F16C"}
    assert {f"-DGGML_{name}=ON" for name in on} <= args
    assert "-DGGML_BACKEND_DL=ON" in args  # one module, loaded like the variants
    assert {
        "-DGGML_AVX512=OFF",
        "-DGGML_AVX_VNNI=OFF",
        "-DGGML_NATIVE=OFF",
        "-DGGML_CPU_ALL_VARIANTS=OFF",
    } <= args


def test_baseline_switches_every_extension_off() -> None:
    options = cpu_cmake("baseline")
    assert options["GGML_NATIVE"] == "OFF" and options["GGML_CPU_ALL_VARIANTS"] == "OFF"
    assert options["GGML_BACKEND_DL"] == "ON"
    assert all(value == "OFF" for key, value in options.items() if key != "GGML_BACKEND_DL")


def test_arm_architecture_goes_to_ggml_cpu_arm_arch() -> None:
    assert check_cpu_level("armv8.2-a+dotprod+fp16") == "armv8.2-a+dotprod+fp16"
    assert cpu_cmake("armv8.2-a+dotprod")["GGML_CPU_ARM_ARCH"] == "armv8.2-a+dotprod"
    assert "GGML_AVX2" not in cpu_cmake("armv8.2-a+dotprod")


def test_level_of_another_architecture_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import llamaforge.build.plan as plan_module

    monkeypatch.setattr(plan_module.platform_module, "machine", lambda: "aarch64")
    with pytest.raises(InvalidOption) as info:
        _args("x86-64-v3")
    assert "x86_64" in info.value.message and "aarch64" in info.value.message
    assert "variants" in (info.value.hint or "")
    assert "-DGGML_CPU_ALL_VARIANTS=ON" in _args("variants")  # arm64 Linux has its own variants


def test_unknown_level_suggests_the_closest() -> None:
    with pytest.raises(InvalidOption) as info:
        _args("x86-64-v5")
    assert "--cpu" in info.value.message and "did you mean 'x86-64-v4'" in info.value.message
    for level in LEVELS:
        assert level in info.value.message


def test_recipe_cpu_field_is_checked_with_file_and_field(tmp_path: Path) -> None:
    source = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    text = source.read_text(encoding="utf-8").replace('cpu = "variants"', 'cpu = "nativ"')
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert str(path) in info.value.message and "cpu" in info.value.message
    assert "did you mean 'native'" in info.value.message


def test_cmake_options_a_level_decides_are_refused(tmp_path: Path) -> None:
    source = Path(__file__).parents[1] / "recipes" / "builds" / "default.toml"
    text = source.read_text(encoding="utf-8").replace("[cmake]\n", "[cmake]\nGGML_NATIVE = true\n")
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    assert "GGML_NATIVE" in info.value.message and 'cpu = "native"' in info.value.message
    with pytest.raises(InvalidOption) as flag:
        plan_build(load_recipe("default"), BuildOptions(cmake=(("GGML_AVX2", "ON"),)))
    assert "GGML_AVX2" in flag.value.message and "--cpu" in (flag.value.hint or "")


def test_plan_records_the_level_and_keys_it() -> None:
    recipe = load_recipe("default")
    variants = plan_build(recipe, BuildOptions(no_patches=True))
    native = plan_build(recipe, BuildOptions(no_patches=True, cpu="native"))
    assert variants.to_json()["cpu"] == "variants" and native.to_json()["cpu"] == "native"
    assert variants.plan_digest != native.plan_digest
