# Create a 2-way ram region from the first two memdevs through the raw sysfs protocol
# and online it (recording helper; pycxl's own 'region create' is the product path).
set -e
cd /sys/bus/cxl/devices
root=${ROOT_DECODER:-decoder0.0}
r=$(cat $root/create_ram_region)
echo $r > $root/create_ram_region
echo 4096 > $r/interleave_granularity
echo 2 > $r/interleave_ways
echo $((512 << 20)) > $r/size
i=0
for sn in ${SERIALS:-0x1 0x2}; do
    for m in mem*; do
        [ "$(cat $m/serial)" = "$sn" ] || continue
        ep=""
        for e in endpoint*; do
            [ "$(basename $(readlink -f $e/uport))" = "$m" ] && ep=$e
        done
        d=$(ls -d $ep/decoder* | head -n1); d=$(basename $d)
        echo ram > $d/mode
        echo $((256 << 20)) > $d/dpa_size
        echo $d > $r/target$i
        i=$((i + 1))
    done
done
echo 1 > $r/commit
echo $r > /sys/bus/cxl/drivers/cxl_region/bind 2>/dev/null || true
sleep 1
for dax in /sys/bus/dax/devices/dax*; do
    start=$(cat $dax/resource); size=$(cat $dax/size)
    bs=$((0x$(cat /sys/devices/system/memory/block_size_bytes)))
    b=$((start / bs)); e=$(((start + size) / bs))
    while [ $b -lt $e ]; do
        echo online_movable > /sys/devices/system/memory/memory$b/state
        b=$((b + 1))
    done
done
echo "region $r online"
