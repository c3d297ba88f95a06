#!/bin/sh
echo "coverage is not available in the offline LBCC build" >&2
exit 1
