module dispatch.invalid/testbed/images

go 1.22
