# Runs inside the testbed guest. Sourced by the per-boot script, which has set
# PYCXL_EXPECT_MEMDEVS, PYCXL_GUEST_CWD and PYCXL_GUEST_COMMAND.
modprobe -a cxl_acpi cxl_pci cxl_port cxl_mem dax_cxl device_dax kmem 2>/dev/null
# Probing is asynchronous: wait until every memdev has its endpoint port.
i=0
while [ "$i" -lt 300 ]; do
    n=$(ls /sys/bus/cxl/devices 2>/dev/null | grep -c '^endpoint')
    [ "$n" -ge "$PYCXL_EXPECT_MEMDEVS" ] && break
    sleep 0.1
    i=$((i + 1))
done
export PYCXL_IN_TESTBED=1
cd "$PYCXL_GUEST_CWD" || exit 70
sh -c "$PYCXL_GUEST_COMMAND"
rc=$?
echo "PYCXL-TESTBED-EXIT=$rc"
