module sluice.local/probe

go 1.22
