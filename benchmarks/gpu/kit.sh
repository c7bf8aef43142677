#!/usr/bin/env bash
# benchmarks/gpu/kit.sh — the project's copy of ../shared/tools/device-kit, with its fixes:
#   - a checkout whose .git has no info/ folder (a fresh clone's may lack it): created before .kit is excluded;
#   - SeqGAN's oracle (shared/data beside the checkout does not travel to the GPU machine) goes into the kit.
# device-kit: pack what the GPU machine lacks (Ray and rayseq's other dependencies) into one folder that
# travels with the working tree, and the script that installs it there.
#
#   DEVICE_LIST=<the GPU machine's package list (KINDS.md)> ../shared/tools/device-kit
#       run in the project checkout: writes .kit/ (git-ignored, ~45 MB)
#   then on the GPU machine:  bash .kit/install.sh && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
#
# Why: the GPU machine has python3.12 + torch 2.11 (CUDA) + transformers/peft/pyarrow/pandas/aiohttp, but no
# Ray, pydantic, fastapi, uvicorn, tensorboardX, gymnasium. Ray's wheel is 79 MB, over the 64 MiB that may
# travel at once; without ray/jars (Java, 33 MB, unused) and xz-compressed it is ~33 MB.
# Download and sizes checked on a CPU machine; the install step has not run on the GPU machine yet.
set -euo pipefail
KIT=${KIT:-.kit}
RAY_VERSION=${RAY_VERSION:-2.60.0}
DEVICE_LIST=${DEVICE_LIST:?set DEVICE_LIST to the package list of the GPU machine: KINDS.md beside the device tool}
# packages not worth their megabytes there (runtime_env venvs, profiler, cloud auth)
SKIP=${SKIP:-"virtualenv py-spy cryptography google-auth google-api-core proto-plus pyasn1 pyasn1-modules cffi pycparser distlib python-discovery platformdirs"}
EXTRA_REQS=${EXTRA_REQS:-"pydantic>=2.5 fastapi>=0.110 tensorboardX>=2.6 gymnasium pytest-timeout"}
# grpcio-reflection's generated code refuses a grpcio older than itself, and the image's grpcio (1.84.0) stays:
# Serve's import fails with the newest reflection. Set it to the image's version (`pip show grpcio` there).
GRPC_REFLECTION=${GRPC_REFLECTION:-"grpcio-reflection==1.84.0"}
# the chit-chat corpus the HF fixtures train their tokenizers on (8 MB as a wheel, 5.5 MB xz-compressed)
CORPUS=${CORPUS:-"chitchat-dataset>=0.9"}
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$KIT"; rm -f "$KIT"/*.whl "$KIT"/ray.tar.xz "$KIT"/corpus.tar.xz
excl="$(git rev-parse --git-path info/exclude)"; mkdir -p "$(dirname "$excl")"
grep -qx "/$KIT/" "$excl" 2>/dev/null || echo "/$KIT/" >> "$excl"
echo "downloading ray[tune,serve,rllib]==$RAY_VERSION and its closure for cp312 ..."
python3 -m pip download -q "${plat[@]}" -d "$tmp/dl" "ray[tune,serve,rllib]==$RAY_VERSION" $EXTRA_REQS \
  "$GRPC_REFLECTION" "$CORPUS"
# names the device image already has (KINDS.md, "Packages: a, b, ...")
sed -n '/Python packages already there/,$p' "$DEVICE_LIST" | grep -o 'Packages: .*' | sed 's/Packages: //; s/\.$//' \
  | tr ',' '\n' | sed 's/^ *//; s/ *$//' | tr 'A-Z_' 'a-z-' | sort -u > "$tmp/has"
norm() { basename "$1" | cut -d- -f1 | tr 'A-Z_' 'a-z-'; }
for w in "$tmp"/dl/*.whl; do
  n=$(norm "$w")
  if [ "$n" = ray ]; then
    mkdir -p "$tmp/ray" && (cd "$tmp/ray" && python3 -m zipfile -e "$w" . )
    tar -C "$tmp/ray" --exclude=ray/jars -cf - . | xz -T0 -6 > "$KIT/ray.tar.xz"
  elif [ "$n" = chitchat-dataset ]; then
    mkdir -p "$tmp/corpus" && (cd "$tmp/corpus" && python3 -m zipfile -e "$w" . )
    tar -C "$tmp/corpus" -cf - . | xz -T0 -9 > "$KIT/corpus.tar.xz"
  elif ! grep -qx "$n" "$tmp/has" && ! [[ " $SKIP " == *" $n "* ]]; then
    cp "$w" "$KIT/"
  fi
done
# SeqGAN's published oracle for benchmarks/gpu/run.sh's oracle part (1.3 MB)
for f in ../shared/data/seqgan_oracle.npz shared/data/seqgan_oracle.npz; do
  if [ -f "$f" ]; then cp "$f" "$KIT/"; break; fi
done
cat > "$KIT/install.sh" <<'SH'
#!/usr/bin/env bash
# on the device: Ray (from the tarball, binaries keep their modes) and the wheels into /tmp/site
set -e
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site
[ -d /tmp/site/ray ] || tar -C /tmp/site -xJf "$here/ray.tar.xz"
[ -f "$here/corpus.tar.xz" ] && { [ -d /tmp/site/chitchat_dataset ] || tar -C /tmp/site -xJf "$here/corpus.tar.xz"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$here"/*.whl
chmod +x /tmp/site/ray/core/src/ray/raylet/raylet /tmp/site/ray/core/src/ray/gcs/gcs_server 2>/dev/null || true
mkdir -p /tmp/site/bin
printf '#!/usr/bin/env bash\nexec python3 -c "import sys; from ray.scripts.scripts import main; sys.argv[0]=\\"ray\\"; sys.exit(main())" "$@"\n' > /tmp/site/bin/ray
chmod +x /tmp/site/bin/ray
echo "kit installed: PYTHONPATH=/tmp/site, PATH+=/tmp/site/bin"
SH
chmod +x "$KIT/install.sh"
du -sh "$KIT"; ls "$KIT" | wc -l
echo "take $KIT along (it is git-ignored) and start the GPU command with: bash $KIT/install.sh && export PYTHONPATH=/tmp/site:\$PWD PATH=/tmp/site/bin:\$PATH &&"
