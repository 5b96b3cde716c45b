# Make pycxl importable on the GPU machine as installed (pycxl.cli and pycxl.native from
# cli/ and native/), with the benchmark kernels built: PYTHONPATH=/tmp/site:/tmp/pkg.
# Expects the wheels pycxl needs (cffi, pycparser, pyudev) in .whl/.
set -e
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
rm -rf /tmp/pkg && mkdir -p /tmp/pkg/pycxl
ln -s "$PWD"/pycxl/* /tmp/pkg/pycxl/ && ln -s "$PWD/cli" /tmp/pkg/pycxl/cli
ln -s "$PWD/native" /tmp/pkg/pycxl/native
export PYTHONPATH=/tmp/site:/tmp/pkg
(cd /tmp/pkg && python3 "$OLDPWD/native/build_bench.py" >/dev/null 2>&1)
(cd /tmp && python3 -c "import pycxl._bench")
