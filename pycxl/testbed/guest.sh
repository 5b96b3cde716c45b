# Runs inside the testbed guest. Sourced by the per-boot script, which has set
# PYCXL_EXPECT_MEMDEVS, PYCXL_GUEST_CWD, PYCXL_GUEST_COMMAND and PYCXL_TESTBED_WORKDIR.
#
# The command's output and exit status go to files in the shared work directory, not
# only to virtme-ng's script I/O ports: those ports are found through udev, and a host
# without udev gives the guest none (virtme-ng then runs the command on the serial
# console, which it discards). The files reach the host either way.
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
: > "$PYCXL_TESTBED_WORKDIR/started"
if cd "$PYCXL_GUEST_CWD"; then
    sh -c "$PYCXL_GUEST_COMMAND" > "$PYCXL_TESTBED_WORKDIR/output" 2>&1 < /dev/null
    rc=$?
else
    echo "testbed: cannot enter $PYCXL_GUEST_CWD in the guest" > "$PYCXL_TESTBED_WORKDIR/output"
    rc=70
fi
echo "$rc" > "$PYCXL_TESTBED_WORKDIR/exit-status.new"
mv "$PYCXL_TESTBED_WORKDIR/exit-status.new" "$PYCXL_TESTBED_WORKDIR/exit-status"
echo "PYCXL-TESTBED-EXIT=$rc"
