# Build the Windows bundle: dist\Speculum\ (Speculum.exe, the window; speculum-cli.exe, the
# command line) and a .zip of it.
#
#   powershell -ExecutionPolicy Bypass -File packaging\build-windows.ps1 [-Variant cpu|cuda]
#
# Needs: 64-bit Python 3.10+ (python.org), Visual Studio 2022 Build Tools with "Desktop
# development with C++" (run from a "x64 Native Tools" prompt, or let CMake find it).
# cuda also needs the CUDA Toolkit 12.x or 13.x (CUDA_PATH set by its installer); the
# bundle carries the CUDA runtime and cuBLAS DLLs, users need only an NVIDIA driver.
# The build venv is %SPECULUM_DEV_CACHE%\bundle-<variant> (default %LOCALAPPDATA%\speculum-dev);
# llama-cpp-python is compiled there once per variant.
# Environment: PYTHON, CUDA_ARCHS (e.g. "86;89"), SPECULUM_SELFTEST_MODEL (a GGUF: run the
# self-test in the finished bundle).
param(
    [ValidateSet("cpu", "cuda")]
    [string]$Variant = "cpu"
)
$ErrorActionPreference = "Stop"
$Start = Get-Date
$Repo = (Resolve-Path (Join-Path $PSScriptRoot "..")).Path
$Cache = if ($env:SPECULUM_DEV_CACHE) { $env:SPECULUM_DEV_CACHE } else { Join-Path $env:LOCALAPPDATA "speculum-dev" }
$Venv = Join-Path $Cache "bundle-$Variant"
$VenvPy = Join-Path $Venv "Scripts\python.exe"
$Py = if ($env:PYTHON) { $env:PYTHON } else { "python" }
$Constraints = Join-Path $Repo "packaging\constraints.txt"

# Native programs do not throw on failure: check every exit code.
function Invoke-Native([string]$What, [scriptblock]$Command) {
    & $Command
    if ($LASTEXITCODE -ne 0) { throw "$What failed (exit code $LASTEXITCODE)" }
}

# GGML_NATIVE=OFF: a native build uses every instruction the build machine has (AVX-512
# on many) and crashes on users' CPUs; the result needs AVX2 (2013 on).
# LLAVA_BUILD=OFF: no multimodal library, Speculum never loads it. No AMX kernels (they
# crash on the first batched decode: llama.cpp issue 20824); RPC for `speculum rpc-worker`.
$CmakeArgs = "-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_RPC=on"
if ($Variant -eq "cuda") {
    if (-not $env:CUDA_PATH) { throw "The cuda variant needs the CUDA Toolkit (CUDA_PATH is not set)." }
    $CmakeArgs += " -DGGML_CUDA=on"
    if ($env:CUDA_ARCHS) { $CmakeArgs += " -DCMAKE_CUDA_ARCHITECTURES=$($env:CUDA_ARCHS)" }
    # PyInstaller finds cudart/cuBLAS, which ggml-cuda.dll links against, on PATH
    # (CUDA 13 moved them to bin\x64).
    $env:PATH = "$($env:CUDA_PATH)\bin;$($env:CUDA_PATH)\bin\x64;$($env:PATH)"
}

New-Item -ItemType Directory -Force -Path $Cache | Out-Null
if (-not (Test-Path $VenvPy)) {
    Write-Host "==> creating the build venv $Venv"
    Invoke-Native "creating the venv" { & $Py -m venv $Venv }
    Invoke-Native "upgrading pip" { & $VenvPy -m pip install -q --disable-pip-version-check --upgrade pip }
}

# pip's wheel cache does not know which backend a cached llama-cpp-python wheel was built
# for: compile it ourselves, bypassing the cache, from the source packaging/llama_cpp_source.py
# edits (the row-invariance switch), and remember the flags and the edits.
$Stamp = Join-Path $Venv ".llama-cmake-args"
$Editor = Join-Path $Repo "packaging\llama_cpp_source.py"
$Edits = (Get-FileHash -Algorithm SHA256 $Editor).Hash.Substring(0, 16).ToLower()
$Want = "$CmakeArgs edits=$Edits"
$Built = if (Test-Path $Stamp) { (Get-Content $Stamp -Raw).Trim() } else { "" }
if ($Built -ne $Want) {
    Write-Host "==> compiling llama-cpp-python ($CmakeArgs); several minutes, much longer for CUDA"
    $Source = (& $VenvPy $Editor (Join-Path $Cache "llama-cpp-source")).Trim()
    if ($LASTEXITCODE -ne 0) { throw "fetching llama-cpp-python's source failed" }
    $env:CMAKE_ARGS = $CmakeArgs
    Invoke-Native "compiling llama-cpp-python" {
        & $VenvPy -m pip install -q --disable-pip-version-check --no-cache-dir --force-reinstall --no-deps $Source
    }
    Remove-Item Env:CMAKE_ARGS
    Set-Content -Path $Stamp -Value $Want
}
Write-Host "==> installing Speculum's dependencies and PyInstaller"
Invoke-Native "installing dependencies" {
    & $VenvPy -m pip install -q --disable-pip-version-check -c $Constraints $Repo pyinstaller pyinstaller-hooks-contrib
}

Write-Host "==> PyInstaller"
Push-Location $Repo
try {
    $Bundle = Join-Path $Repo "dist\Speculum"
    if (Test-Path $Bundle) { Remove-Item -Recurse -Force $Bundle }
    $env:SPECULUM_VARIANT = $Variant
    Invoke-Native "PyInstaller" {
        & $VenvPy -m PyInstaller --noconfirm --clean --distpath dist --workpath "build\pyinstaller-windows-$Variant" packaging\speculum.spec
    }

    $Cli = Join-Path $Bundle "speculum-cli.exe"
    if ($Variant -eq "cuda") {
        $Cublas = Get-ChildItem -Path $Bundle -Recurse -Filter "cublas64_*.dll"
        if (-not $Cublas) { throw "cuBLAS was not collected: is CUDA_PATH\bin on PATH?" }
    }
    Write-Host "==> checking the bundle starts"
    Invoke-Native "speculum-cli --version" { & $Cli --version }
    Invoke-Native "speculum-cli doctor" { & $Cli doctor }
    if ((& $Cli doctor | Out-String) -notmatch "AMX kernels\s+none") {
        throw "The bundle's llama.cpp has AMX kernels: it would crash on CPUs with AMX."
    }
    if ($Variant -eq "cuda") {
        # Needs an NVIDIA GPU and driver on the build machine; without one, ggml-cuda reports no device.
        $Doctor = & $Cli doctor | Out-String
        if ($Doctor -notmatch "Compute backend\s+CUDA") { Write-Warning "doctor does not report CUDA (no NVIDIA driver here?)" }
    }
    if ($env:SPECULUM_SELFTEST_MODEL) {
        Invoke-Native "self-test" { & $Cli --self-test $env:SPECULUM_SELFTEST_MODEL }
    }

    $Version = ((& $Cli --version) -split " ")[1]
    $Zip = Join-Path $Repo "dist\Speculum-$Version-windows-x64-$Variant.zip"
    if (Test-Path $Zip) { Remove-Item -Force $Zip }
    Compress-Archive -Path $Bundle -DestinationPath $Zip
    $Size = "{0:N0} MB" -f ((Get-ChildItem -Recurse $Bundle | Measure-Object -Sum Length).Sum / 1MB)
    Write-Host ("==> done in {0:N0} s" -f ((Get-Date) - $Start).TotalSeconds)
    Write-Host "    bundle $Bundle  $Size"
    Write-Host "    zip    $Zip"
}
finally {
    Pop-Location
}
