# On the GPU machine, after gpu_machine_check.sh installed pycxl: pinned tensors and the
# staged copier against PyTorch (three rounds, with the staged copier's shape sweep), the
# ZeRO-Offload example with its optimizer state on dram0, and the long-term pin probe.
export PYTHONUNBUFFERED=1
cd /tmp || exit 1
R="$OLDPWD"
python3 "$R/benchmarks/pinned_vs_torch.py" --size 1G --rounds 3 ${TUNE:+--tune}
python3 "$R/examples/zero_offload.py" --tier dram0 --layers 8 --width 4096 --steps 10
pycxl pin-probe
