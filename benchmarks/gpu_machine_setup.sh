# Install pycxl on the GPU machine the way a user does (pip install ., from the wheels
# carried in .whl/, which gpu_machine_wheels.sh fetches: cffi, pycparser, pyudev, and
# setuptools and wheel to build), then
# copy the tests and docs outside the source tree, so they run against the installed
# package: cd /tmp/pkg && python3 -m pytest tests/gpu tests/smoke/test_docs.py
set -e
python3 -m pip install -q --no-index --find-links .whl . 2>&1 | grep -v "Running pip as the 'root' user" || true
command -v pycxl
rm -rf /tmp/pkg && mkdir -p /tmp/pkg
cp -r tests docs examples README.md pyproject.toml /tmp/pkg/
(cd /tmp && python3 -c "import pycxl, pycxl._bench; print('pycxl', pycxl.__version__, 'from', pycxl.__file__)")
